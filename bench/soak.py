"""``python -m bench soak``: many calls while workers die, Redis restarts and poison arrives.

It starts a private Redis with AOF and two prefork workers, sends ``--calls`` calls
(``--in-flight`` at a time) mixing ``get_today_date``, ``search`` (at most once) and
:func:`soak_book_flight` (an idempotent booking, at least once, one ``run_scope`` per
call), and on the way warm-restarts a worker (SIGTERM, as a deploy does) at 15 % of the
calls ended, SIGKILLs and restarts a worker at 25 % and 60 %, restarts Redis at 45 %,
pushes one poison message at 35 % and makes Redis refuse every write (``maxmemory``,
``noeviction``) for two seconds at 75 %. Then it checks
(:mod:`bench.soak_checks`) and prints (:mod:`bench.soak_report`):

* every call ended in a result or a typed error, and each error is one an injected
  fault explains, within that fault's bound (``WorkerLost`` only for at-most-once calls
  held by a killed worker, ``ToolOutcomeUnknown`` only for messages Redis lost in its
  restart, nothing else: the warm restart and the full Redis explain no error);
* one booking per successful booking call, none twice, and no body run again unless a
  SIGKILL cut its earlier run off (the tool records every run and its process);
* the poison was dead-lettered and no worker died of it;
* the Redis keys: back to the kinds it started with, but for keys whose TTL rule
  outlives the wait, each within its rule (``--wait-ttl`` first waits for every call's
  keys to expire; ``--short-ttls`` makes that seconds);
* worker RSS: the same processes, sampled after the last restart, stay flat.

The exit status is 1 if any check failed. ``--smoke`` is CI's shortened soak.

Workers import this module for :func:`soak_book_flight` (``TOOLEXEC_TOOL_MODULES``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Annotated, Any

import redis
from pydantic import Field, StringConstraints

from bench.soak_checks import (
    KeyRules,
    check_errors,
    check_keys,
    check_rss,
    error_bounds,
    ledger,
    reruns,
    rss_of,
    runs_db,
    wait_for_call_keys,
)
from bench.soak_report import Findings, render
from executor import current_call, tool
from tasks.flights import FLIGHT_ID_PATTERN, Booking, book_flight, ledger_path

__all__ = ["main", "soak_book_flight"]

_QUEUE = "default"
_BOOK = "soak_book_flight"
_TOOLS = ("get_today_date", "search", _BOOK)
_AT_MOST_ONCE = ("get_today_date", "search")
_PASSENGER_PREFIX = "Soak Passenger "
_RUNS_FILE = "soak-runs.sqlite3"
_WORKERS, _CONCURRENCY = 2, 2
#: A call that has not ended this long after its deadline never ends.
_GRACE = 30.0
#: The workers' and client's TTL settings: the soak's own, and --short-ttls' (seconds).
_TTLS = {"TOOLEXEC_REPLY_TTL": "30", "TOOLEXEC_OUTCOME_TTL": "60"}
_SHORT_TTLS = {
    "TOOLEXEC_REPLY_TTL": "5",
    "TOOLEXEC_OUTCOME_TTL": "5",
    "TOOLEXEC_CLAIM_MARGIN": "1",
    "TOOLEXEC_HEARTBEAT_INTERVAL": "1",
}


@tool(idempotent=True, name=_BOOK)
def soak_book_flight(
    flight_id: Annotated[str, Field(pattern=FLIGHT_ID_PATTERN)],
    passenger: Annotated[str, StringConstraints(min_length=1, max_length=100)],
) -> Booking:
    """Book one seat like ``book_flight``, as an idempotent tool (the soak's side effect).

    Args:
        flight_id: The flight number, e.g. "SK117".
        passenger: The passenger's full name.
    """
    call = current_call()
    with runs_db(ledger_path().with_name(_RUNS_FILE)) as db, db:
        db.execute(
            "INSERT INTO runs (idempotency_key, pid) VALUES (?, ?)",
            (call.idempotency_key, os.getpid()),
        )
    return book_flight(flight_id=flight_id, passenger=passenger)


@dataclass
class _Tally:
    """What the calls have done so far."""

    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)  # (tool, result or error)
    booked: dict[str, str] = field(default_factory=dict)  # passenger -> booking_id
    ended: int = 0
    never_ended: int = 0
    samples: dict[str, str] = field(default_factory=dict)  # error type -> one message
    #: Seconds since the calls began: each fault's start and end, each call that did not
    #: end in a result (when it was sent and ended, its id, its error), in that order.
    timeline: list[tuple[float, str]] = field(default_factory=list)
    began: float = field(default_factory=time.monotonic)

    def note(self, line: str, at: float | None = None) -> None:
        moment = time.monotonic() if at is None else at
        self.timeline.append((moment - self.began, line))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the soak and print its report; the exit status (0: every check passed)."""
    args = _parser().parse_args(argv)
    if args.smoke:
        args.calls, args.in_flight, args.deadline = 600, 50, 15.0
        args.short_ttls = args.wait_ttl = True
    command = shlex.join(
        ["python", "-m", "bench", "soak", *(sys.argv[2:] if argv is None else argv)]
    )
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        return _soak(args, args.keep, command)
    with TemporaryDirectory(prefix="toolexec-soak-") as tmp:
        return _soak(args, Path(tmp), command)


def _soak(args: argparse.Namespace, workdir: Path, command: str) -> int:
    import agent_client
    from agent_client import RemoteTool, remote_tool
    from bench.harness import PROJECT_ROOT
    from toolexec import RedisServer, WorkerProcess
    from wire import keys
    from wire.settings import Settings

    server = RedisServer(directory=workdir / "redis", appendonly=True).start()
    workers: list[WorkerProcess] = []
    try:
        env = {
            "TOOLEXEC_BROKER_URL": server.url,
            "TOOLEXEC_REDIS_URL": server.url,
            "TOOLEXEC_TOOL_MODULES": "tasks,bench.soak",
            "TOOLEXEC_DATA_DIR": str(workdir / "data"),
            **(_SHORT_TTLS if args.short_ttls else _TTLS),
        }
        for number in range(1, _WORKERS + 1):
            workers.append(
                WorkerProcess(
                    name=f"soak{number}",
                    pool="prefork",
                    concurrency=_CONCURRENCY,
                    queues=(_QUEUE,),
                    env=env,
                    cwd=PROJECT_ROOT,
                    log_dir=workdir / "logs",
                    loglevel="INFO" if args.keep is not None else "WARNING",
                ).start(wait=False)
            )
        for worker in workers:
            worker.wait_ready(60.0)
        settings = Settings.from_env(env)
        client = agent_client.configure(settings)
        db = redis.Redis.from_url(server.url)
        try:
            # The proxies first: their catalog read starts the client, whose liveness key
            # (wire.keys.caller) is then part of the baseline, as the heartbeats are.
            tools: dict[str, RemoteTool] = {
                name: remote_tool(name, client=client) for name in _TOOLS
            }
            _wait_for(lambda: client.beating, 10.0)
            baseline = int(db.dbsize())
            rss: dict[str, list[int]] = {"start": [_total_rss(w) for w in workers]}
            later: list[dict[int, int]] = []  # RSS per process, after the last restart
            chaos_log: list[str] = []
            killed: set[int] = set()  # the pool processes of the workers SIGKILLed
            outage: list[float] = []

            def kill_and_restart(index: int) -> Callable[[], None]:
                def act() -> None:
                    worker = workers[index]
                    old = worker.pid
                    killed.update(worker.child_pids())  # SIGKILLed with it (pdeathsig)
                    worker.kill()
                    worker.start(wait=True, timeout=60.0)
                    chaos_log.append(
                        f"SIGKILLed {worker.name} (pid {old}), restarted as pid {worker.pid}"
                    )

                return act

            def restart_redis() -> None:
                began = time.monotonic()
                server.restart()
                outage.append(time.monotonic() - began)
                chaos_log.append(
                    f"restarted Redis on port {server.port} (AOF) in {outage[-1]:.2f} s"
                )

            def warm_restart(index: int) -> Callable[[], None]:
                def act() -> None:  # a deploy: SIGTERM, its running calls finish, it starts again
                    worker = workers[index]
                    old = worker.pid
                    worker.stop(timeout=60.0)
                    worker.start(wait=True, timeout=60.0)
                    chaos_log.append(
                        f"warm-restarted {worker.name} (pid {old}, SIGTERM), now pid {worker.pid}"
                    )

                return act

            def memory_full(seconds: float) -> Callable[[], None]:
                def act() -> None:  # Redis refuses every write for a while (maxmemory, noeviction)
                    used = int(db.info("memory")["used_memory"])
                    db.config_set("maxmemory-policy", "noeviction")
                    db.config_set("maxmemory", max(1, used // 2))
                    try:
                        time.sleep(seconds)  # the outage's length
                    finally:
                        db.config_set("maxmemory", 0)
                    chaos_log.append(
                        f"made Redis refuse writes (maxmemory below its use) for {seconds:g} s"
                    )

                return act

            def poison() -> None:
                db.lpush(_QUEUE, b"garbage")
                chaos_log.append(f"LPUSHed b'garbage' onto {_QUEUE!r}")

            def sample(when: str) -> Callable[[], None]:
                def act() -> None:
                    rss[when] = [_total_rss(w) for w in workers]
                    if when != "middle":
                        later.append(rss_of(pid for w in workers for pid in _pids(w)))

                return act

            plan: list[tuple[float, Callable[[], None]]] = [
                (0.15, warm_restart(1)),
                (0.25, kill_and_restart(0)),
                (0.35, poison),
                (0.45, restart_redis),
                (0.50, sample("middle")),
                (0.60, kill_and_restart(1)),
                (0.70, sample("70 %")),
                (0.75, memory_full(2.0)),
                (0.85, sample("85 %")),
            ]
            start = time.monotonic()
            tally = asyncio.run(_drive(args, tools, plan))
            took = time.monotonic() - start
            (workdir / "timeline.log").write_text(
                "".join(f"{at:7.2f} s  {line}\n" for at, line in sorted(tally.timeline))
            )
            _wait_queue_empty(db, 60.0)
            sample("end")()
            pids = {w.name: w.pid for w in workers}
            rules = KeyRules(
                interval=settings.heartbeat_interval,
                reply_ttl=settings.reply_ttl,
                outcome_ttl=settings.outcome_ttl,
                claim_ttl=args.deadline + settings.claim_margin,
                run_log_ttl=settings.run_log_ttl,
            )
            waited = (
                wait_for_call_keys(db, rules.longest_call_rule + _GRACE) if args.wait_ttl else None
            )
            key_check = check_keys(db, baseline=baseline, rules=rules)
            poisoned = int(db.hget(keys.DEADLETTER_COUNT, "not_json") or 0)
        finally:
            db.close()
            client.close()
        booked_ledger = ledger(ledger_path(workdir / "data"), _PASSENGER_PREFIX)
        reran = reruns(ledger_path(workdir / "data").with_name(_RUNS_FILE), killed)
        alive = [w.name for w in workers if w.is_running and w.pid == pids[w.name]]
    finally:
        for worker in workers:
            worker.stop()
        server.close()

    bounds = error_bounds(
        kills=2,
        concurrency=_CONCURRENCY,
        redis_restarts=1,
        workers=_WORKERS,
        at_most_once=_AT_MOST_ONCE,
    )
    growth, rss_problems = check_rss(later)
    problems = check_errors(tally.outcomes, bounds)
    if tally.never_ended or tally.ended != args.calls:
        problems.append(f"{args.calls - tally.ended + tally.never_ended} calls never ended")
    problems += [
        f"untyped {kind} ({tool})"
        for (tool, kind), _ in tally.outcomes.items()
        if kind.startswith("untyped ")
    ]
    if outage and outage[0] >= args.deadline:
        problems.append(f"Redis was away {outage[0]:.1f} s, longer than a call's deadline")
    duplicates = sum(n - 1 for n in booked_ledger.values() if n > 1)
    missing = sum(1 for passenger in tally.booked if passenger not in booked_ledger)
    extra = sum(1 for passenger in booked_ledger if passenger not in tally.booked)
    problems += [f"{duplicates} duplicate bookings"] if duplicates else []
    problems += [f"{missing} successful bookings missing from the ledger"] if missing else []
    problems += (
        [f"{reran.unexplained} bodies run again with no kill to explain it"]
        if reran.unexplained
        else []
    )
    problems += [] if poisoned >= 1 else ["the poison message was not dead-lettered"]
    problems += (
        [] if len(alive) == len(workers) else [f"only {alive} of the workers lived to the end"]
    )
    problems += key_check.problems(waited=args.wait_ttl, live_workers=len(workers))
    problems += rss_problems
    findings = Findings(
        command=command,
        calls=args.calls,
        in_flight=args.in_flight,
        deadline=args.deadline,
        took=took,
        chaos=chaos_log,
        outcomes=tally.outcomes,
        never_ended=tally.never_ended,
        samples=tally.samples,
        bounds=bounds,
        booked=len(tally.booked),
        ledger=booked_ledger,
        missing=missing,
        extra=extra,
        reruns=reran,
        keys=key_check,
        waited=waited,
        rss=rss,
        growth=growth,
        later=later,
        problems=problems,
    )
    print(render(findings), flush=True)
    return 1 if problems else 0


async def _drive(
    args: argparse.Namespace, tools: dict[str, Any], plan: list[tuple[float, Callable[[], None]]]
) -> _Tally:
    from agent_client import RemoteToolError, run_scope

    tally = _Tally()
    semaphore = asyncio.Semaphore(args.in_flight)
    progress = asyncio.Condition()

    async def one(i: int) -> None:
        name = _TOOLS[i % len(_TOOLS)]
        arguments: dict[str, Any] = {}
        sent: float | None = None
        try:
            async with semaphore:
                sent = time.monotonic()
                if name == _BOOK:
                    passenger = f"{_PASSENGER_PREFIX}{i}"
                    arguments = {"flight_id": f"SK{i % 10_000}", "passenger": passenger}
                    with run_scope():  # its own run: one booking per call
                        call = tools[name].invoke(arguments, timeout=args.deadline)
                        result = await asyncio.wait_for(call, args.deadline + _GRACE)
                    tally.booked[passenger] = str(result["booking_id"])
                else:
                    if name == "search":
                        arguments = {"query": "fox grapes", "limit": 3}
                    call = tools[name].invoke(arguments, timeout=args.deadline)
                    await asyncio.wait_for(call, args.deadline + _GRACE)
            tally.outcomes[(name, "result")] += 1
        except RemoteToolError as error:
            tally.outcomes[(name, type(error).__name__)] += 1
            tally.samples.setdefault(type(error).__name__, str(error)[:200])
            at = "" if sent is None else f"sent at {sent - tally.began:.2f} s, "
            tally.note(f"{at}{name} call {error.call_id} ended in {type(error).__name__}")
        except TimeoutError:
            tally.never_ended += 1
        except Exception as error:  # noqa: BLE001 - counted: the soak's first check
            tally.outcomes[(name, f"untyped {type(error).__name__}")] += 1
            tally.samples.setdefault(f"untyped {type(error).__name__}", f"{name}: {error}"[:200])
        finally:
            async with progress:
                tally.ended += 1
                progress.notify_all()

    def reached(limit: int) -> Callable[[], bool]:
        return lambda: tally.ended >= limit

    async def chaos() -> None:
        for fraction, act in plan:
            threshold = int(args.calls * fraction)
            async with progress:
                await progress.wait_for(reached(threshold))
            step = [part for part in act.__qualname__.split(".") if part not in _NOT_NAMES][-1]
            tally.note(f"{step} begins ({fraction:.0%} of the calls ended)")
            await asyncio.to_thread(act)
            tally.note(f"{step} over")

    chaos_task = asyncio.create_task(chaos())
    await asyncio.gather(*(one(i) for i in range(args.calls)))
    await chaos_task
    return tally


#: The parts of a chaos step's qualified name that do not name it.
_NOT_NAMES = ("_soak", "<locals>", "act")


def _wait_for(condition: Callable[[], bool], timeout: float) -> None:
    ends = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > ends:
            raise RuntimeError(f"gave up after {timeout:g} s waiting for {condition}")
        time.sleep(0.02)


def _pids(worker: Any) -> list[int]:
    return ([worker.pid] if worker.pid is not None else []) + list(worker.child_pids())


def _total_rss(worker: Any) -> int:
    """Resident set size in KiB of a worker's main process plus its pool processes."""
    return sum(rss_of(_pids(worker)).values())


def _wait_queue_empty(db: redis.Redis, timeout: float) -> None:
    ends = time.monotonic() + timeout
    while int(db.llen(_QUEUE)) and time.monotonic() < ends:
        time.sleep(0.1)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench soak", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--calls", type=int, default=10_000, help="calls to send")
    parser.add_argument("--in-flight", type=int, default=200, help="calls in flight at once")
    parser.add_argument("--deadline", type=float, default=15.0, help="each call's deadline (s)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="CI's soak: 600 calls, 50 in flight, 15 s deadlines, --short-ttls --wait-ttl",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="work in DIR and keep it (worker logs, Redis AOF, booking ledger) for a post-mortem",
    )
    parser.add_argument(
        "--short-ttls",
        action="store_true",
        help="TTLs of seconds (replies and outcomes 5 s, claim margin 1 s, heartbeat interval 1 s)",
    )
    parser.add_argument(
        "--wait-ttl",
        action="store_true",
        help="wait for every call's keys to expire before counting keys",
    )
    return parser
