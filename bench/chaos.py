"""``python -m bench chaos``: a seeded random schedule of faults, and a check of every promise.

Per seed: a private Redis (no persistence), one worker of each pool (prefork, threads,
asyncio) serving the chaos tools (:mod:`bench.chaos_tools`: at most once, at least once,
idempotent), and caller processes (:mod:`bench.chaos_caller`) sending calls with 8 s
deadlines for ``--seconds``. Meanwhile faults drawn from the seed strike every 1.5 to 4
seconds, from everything docs/guarantees.md names: a worker SIGKILLed, stopped warm
(SIGTERM) or cold (SIGQUIT) and started again; Redis paused (``CLIENT PAUSE``, 1 to 3 s),
restarted without its data, or refusing writes (``maxmemory``) for 2 s; every connection
dropped (``CLIENT KILL``); a caller SIGKILLed (another takes its place); a poison message.

The checker reads the tools' side-effect log and every caller's outcomes and counts, for
every call, each broken promise (a violation):

* ``ran twice``: an at-most-once body started twice, or an idempotent body ran to its end
  twice (unless, between the two starts, Redis restarted without its data, or a worker
  was killed, which may cut the first run's delivery off before its outcome is stored:
  at-least-once, as documented);
* ``CallerGone to a live caller``; ``WorkerLost`` with no worker killed while the call
  lived; a timeout for a call whose body had ended a second before its deadline (unless
  a Redis restart forgot its reply too close to the deadline for the watchdog to notice:
  three intervals and a half);
* ``late``: an outcome heard more than 0.5 s after the deadline; ``untyped``: anything but
  a result or a ``RemoteToolError``; ``lost``: a call its (live) caller never heard of;
* ``started after it was given up``: a body that started after its caller was told
  ``WorkerLost`` or ``ToolOutcomeUnknown`` (at most once and idempotent calls);
* ``started after its caller died``: a body of a SIGKILLed caller's call that started
  later than the documented bound (an interval and a third, plus 0.5 s of slack);
* ``key without a TTL``: a ``toolexec:`` key left without one (the catalog and the
  workers set excepted).

A failing seed is printed with the command that replays it. ``--seeds N`` runs seeds
``--first-seed`` .. N-1 more; the summary gives violations per 10,000 calls.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import redis

from bench.chaos_tools import QUEUE, effects_path

__all__ = ["main"]

_INTERVAL = 1.0
#: How long after its caller's death a body may still start (docs: an interval and a third).
_DEAD_CALLER_BOUND = _INTERVAL * 4 / 3 + 0.5
#: How long after a Redis restart a call whose reply it forgot hears ``ToolOutcomeUnknown``
#: at most (docs/guarantees.md): an interval for the workers to beat again, an interval
#: between the watchdog's two looks, up to an interval until its next round, and slack.
_REPLY_FORGOTTEN_NOTICED = _INTERVAL * 3 + 0.5
#: How late past its deadline an outcome may be heard.
_LATE = 0.5
_POOLS: dict[str, int] = {"prefork": 2, "threads": 4, "asyncio": 20}
_FAULTS = (
    "worker SIGKILL",
    "worker SIGTERM",
    "worker SIGQUIT",
    "redis pause",
    "redis restart",
    "redis full",
    "connections dropped",
    "caller SIGKILL",
    "poison",
)


@dataclass
class _Fault:
    """One fault: when it struck, what it was, and when it was over (Redis paused until
    its pause ended, full until its memory was freed, restarted once it served again)."""

    at: float
    name: str
    detail: str
    ended: float | None = None

    @property
    def until(self) -> float:
        """When the fault was over (the moment it struck, if that is all that is known)."""
        if self.name == "redis pause":
            return self.at + int(self.detail.split()[0]) / 1000
        return self.at if self.ended is None else self.ended


@dataclass
class _Seed:
    seed: int
    calls: int = 0
    faults: list[_Fault] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the seeds and print each one's findings; exit status 1 on any violation."""
    args = _parser().parse_args(argv)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    results: list[_Seed] = []
    for seed in seeds:
        if args.keep is not None:
            workdir = args.keep / f"seed-{seed}"
            workdir.mkdir(parents=True, exist_ok=True)
            results.append(_run(seed, args, workdir))
        else:
            with TemporaryDirectory(prefix=f"toolexec-chaos-{seed}-") as tmp:
                results.append(_run(seed, args, Path(tmp)))
        _print_seed(results[-1], args)
    calls = sum(r.calls for r in results)
    violations = sum(len(r.violations) for r in results)
    faults = sum(len(r.faults) for r in results)
    rate = 10_000 * violations / calls if calls else 0.0
    print(
        f"\nchaos: {len(results)} seeds, {args.seconds:g} s of faults each, {faults} faults, "
        f"{calls} calls, {violations} violations ({rate:.2f} per 10,000 calls)",
        flush=True,
    )
    failing = [r.seed for r in results if r.violations]
    if failing:
        print("failing seeds (replay each with the command):", flush=True)
        for seed in failing:
            skips = "".join(f" --skip {shlex.quote(f)}" for f in args.skip)
            print(
                f"  python -m bench chaos --first-seed {seed} --seeds 1 --seconds "
                f"{args.seconds:g}{skips}",
                flush=True,
            )
    return 1 if failing else 0


def _print_seed(result: _Seed, args: argparse.Namespace) -> None:
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(result.outcomes.items()))
    faults = Counter(f.name for f in result.faults)
    print(
        f"seed {result.seed}: {result.calls} calls ({kinds}); faults: "
        + ", ".join(f"{name} ×{n}" for name, n in sorted(faults.items()))
        + f"; {len(result.violations)} violations",
        flush=True,
    )
    for violation in result.violations[: args.show]:
        print(f"  VIOLATION {violation}", flush=True)
    if len(result.violations) > args.show:
        print(f"  ... and {len(result.violations) - args.show} more", flush=True)


def _run(seed: int, args: argparse.Namespace, workdir: Path) -> _Seed:
    from bench.harness import PROJECT_ROOT
    from toolexec import RedisServer, WorkerProcess

    rng = random.Random(seed)
    result = _Seed(seed)
    faults = [f for f in _FAULTS if f not in args.skip]
    server = RedisServer(directory=workdir / "redis").start()
    env = {
        "TOOLEXEC_BROKER_URL": server.url,
        "TOOLEXEC_REDIS_URL": server.url,
        "TOOLEXEC_TOOL_MODULES": "bench.chaos_tools",
        "TOOLEXEC_DATA_DIR": str(workdir / "data"),
        "TOOLEXEC_HEARTBEAT_INTERVAL": f"{_INTERVAL:g}",
        "TOOLEXEC_REPLY_TTL": "30",
        "TOOLEXEC_OUTCOME_TTL": "60",
        "TOOLEXEC_CLAIM_MARGIN": "2",
    }
    workers = {
        pool: WorkerProcess(
            name=f"chaos-{pool}-{seed}",
            pool=pool,  # type: ignore[arg-type]
            concurrency=concurrency,
            queues=(QUEUE,),
            env=env,
            cwd=PROJECT_ROOT,
            log_dir=workdir / "logs",
        )
        for pool, concurrency in _POOLS.items()
    }
    callers: dict[int, tuple[subprocess.Popen[bytes], Path]] = {}
    logs: list[Any] = []  # the callers' stderr files, closed at the end
    deaths: dict[str, float] = {}  # a killed caller's pid -> when it died
    store = redis.Redis.from_url(server.url, socket_timeout=10)
    try:
        for worker in workers.values():
            worker.start(wait=False)
        for worker in workers.values():
            worker.wait_ready(90.0)
        started = time.time()
        ends = time.monotonic() + args.seconds

        def caller(number: int) -> None:
            out = workdir / f"caller-{number}.jsonl"
            left = max(1.0, ends - time.monotonic())
            logs.append(open(workdir / f"caller-{number}.log", "wb"))  # noqa: SIM115 - closed at the end
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.chaos_caller",
                    str(out),
                    str(rng.randrange(1 << 30)),
                    f"{left:.1f}",
                    str(args.in_flight),
                    f"{args.deadline:g}",
                ],
                env={**os.environ, **env},
                cwd=PROJECT_ROOT,
                stdout=subprocess.DEVNULL,
                stderr=logs[-1],
            )
            callers[number] = (process, out)

        for number in range(args.callers):
            caller(number)
        next_fault = time.monotonic() + rng.uniform(1.5, 3.0)
        while time.monotonic() < ends - 1.0:
            time.sleep(max(0.0, min(next_fault, ends) - time.monotonic()))
            if time.monotonic() >= ends - 1.0:
                break
            name = rng.choice(faults)
            struck = time.time()  # when it struck: a worker's restart after it takes seconds
            detail = _strike(name, rng, server, store, workers, callers, deaths, caller)
            result.faults.append(_Fault(struck, name, detail, ended=time.time()))
            with open(workdir / "faults.log", "a") as fault_log:
                fault_log.write(f"{result.faults[-1].at:.4f} {name}: {detail}\n")
            next_fault = time.monotonic() + rng.uniform(1.5, 4.0)
        for process, _ in list(callers.values()):
            try:
                process.wait(timeout=args.deadline + 60)
            except subprocess.TimeoutExpired:
                process.kill()
                result.violations.append(
                    f"a caller (pid {process.pid}) never finished: calls hung past their deadlines"
                )
        _settle(store)
        result.violations += _keys_without_ttl(store)
    finally:
        store.close()
        for process, _ in callers.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        for log in logs:
            log.close()
        for worker in workers.values():
            worker.stop()
        server.close()
    sent, ended = _read_callers(sorted(workdir.glob("caller-*.jsonl")))  # the killed callers' too
    effects = _read_effects(effects_path(workdir / "data"))
    result.calls = len(sent)
    result.outcomes = Counter(
        e["outcome"] if e["outcome"] in _KNOWN else "other" for e in ended.values()
    )
    result.violations += _check(sent, ended, effects, result.faults, deaths, args.deadline, started)
    return result


_KNOWN = {
    "result",
    "ToolTimeoutError",
    "WorkerLost",
    "ToolOutcomeUnknown",
    "BrokerUnavailable",
    "CallerGone",
    "ToolExecutionError",
    "ToolCancelled",
    "ToolNotFound",
}


def _strike(
    name: str,
    rng: random.Random,
    server: Any,
    store: redis.Redis,
    workers: dict[str, Any],
    callers: dict[int, tuple[subprocess.Popen[bytes], Path]],
    deaths: dict[str, float],
    caller: Callable[[int], None],
) -> str:
    """Cause the fault ``name``; what it did."""
    if name.startswith("worker "):
        pool = rng.choice(sorted(workers))
        worker = workers[pool]
        if name == "worker SIGKILL":
            worker.kill()
        elif name == "worker SIGTERM":
            worker.stop(timeout=30.0)
        else:
            os.kill(worker.pid, signal.SIGQUIT)
            ends = time.monotonic() + 15.0
            while worker.is_running and time.monotonic() < ends:
                time.sleep(0.05)
            if worker.is_running:
                worker.kill()
        worker.start(wait=True, timeout=90.0)
        return pool
    if name == "redis pause":
        ms = rng.randrange(1000, 3001)
        store.execute_command("CLIENT", "PAUSE", ms)  # type: ignore[no-untyped-call]
        return f"{ms} ms"
    if name == "redis restart":
        server.kill()
        server.start()
        return "without its data"
    if name == "redis full":
        used = int(store.info("memory")["used_memory"])
        store.config_set("maxmemory", max(1, used // 2))
        time.sleep(2.0)
        store.config_set("maxmemory", 0)
        return "2 s"
    if name == "connections dropped":
        killed = 0
        for kind in ("normal", "pubsub"):
            killed += int(store.execute_command("CLIENT", "KILL", "TYPE", kind, "SKIPME", "yes"))  # type: ignore[no-untyped-call]
        return f"{killed} connections"
    if name == "caller SIGKILL":
        number = rng.choice(sorted(callers))
        process, _ = callers[number]
        if process.poll() is not None:
            return "(it had ended)"
        process.kill()
        process.wait()
        deaths[str(process.pid)] = time.time()
        caller(max(callers) + 1)
        return f"pid {process.pid}"
    store.lpush(QUEUE, b"garbage")  # poison
    return "b'garbage'"


def _settle(store: redis.Redis) -> None:
    """Wait for the queue to empty and the last bodies to end (bounded)."""
    ends = time.monotonic() + 30.0
    while time.monotonic() < ends:
        try:
            if not int(store.llen(QUEUE)):
                break
        except redis.RedisError:
            pass
        time.sleep(0.2)
    time.sleep(2.0)  # the last bodies (at most 0.8 s of work) end


def _keys_without_ttl(store: redis.Redis) -> list[str]:
    from wire import keys

    allowed = {keys.CATALOG, keys.WORKERS}
    found = []
    for key in store.scan_iter(match=f"{keys.PREFIX}*", count=1000):
        name = key.decode()
        if name not in allowed and int(store.pttl(key)) == -1:
            found.append(f"key without a TTL: {name}")
    return found


def _read_callers(
    paths: Sequence[Path],
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    sent: dict[str, dict[str, Any]] = {}
    ended: dict[str, dict[str, Any]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # the last line of a caller killed mid-write
            if "sent" in event:
                sent[event["sent"]] = event
            elif "ended" in event:
                ended[event["ended"]] = event
    return sent, ended


def _read_effects(path: Path) -> dict[str, list[tuple[str, float]]]:
    effects: dict[str, list[tuple[str, float]]] = defaultdict(list)
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4:
                effects[parts[1]].append((parts[0], float(parts[3])))
    return effects


#: The Redis faults after which the client's evidence starts again (agent_client._io.writes).
_REDIS_FAULTS = ("redis restart", "redis pause", "redis full")


def _redis_settled(restart: float, faults: list[_Fault]) -> float:
    """When Redis was steady again after the restart at ``restart``: the end of the last
    Redis fault of those that followed it each within :data:`_REPLY_FORGOTTEN_NOTICED`
    of the one before's end (a pause or full memory voids the looks a restart's
    forgotten reply is noticed by, so their count starts again)."""
    settled = max((f.until for f in faults if f.at == restart), default=restart)
    for fault in sorted(faults, key=lambda f: f.at):
        if fault.at <= restart or fault.name not in _REDIS_FAULTS:
            continue
        if fault.at > settled + _REPLY_FORGOTTEN_NOTICED:
            break
        settled = max(settled, fault.until)
    return settled


def _check(
    sent: dict[str, dict[str, Any]],
    ended: dict[str, dict[str, Any]],
    effects: dict[str, list[tuple[str, float]]],
    faults: list[_Fault],
    deaths: dict[str, float],
    deadline: float,
    began: float,
) -> list[str]:
    """Every broken promise of the run, one line each."""
    restarts = [f.at for f in faults if f.name == "redis restart"]
    settled = {r: _redis_settled(r, faults) for r in restarts}
    outages = [(f.at, f.until) for f in faults if f.name in _REDIS_FAULTS]
    kills = [f.at for f in faults if f.name in ("worker SIGKILL", "worker SIGQUIT")]
    found: list[str] = []
    for token, call in sent.items():
        tool, at = call["tool"], float(call["at"])
        runs = effects.get(token, [])
        starts = [t for what, t in runs if what == "start"]
        finishes = [t for what, t in runs if what == "end"]
        pid = token.split("-", 1)[0]
        died = deaths.get(pid)
        if tool == "chaos_plain" and len(starts) > 1:
            found.append(f"ran twice: at-most-once {token} started {len(starts)} times")
        if tool == "chaos_idem" and len(finishes) > 1:
            first, again = min(starts or finishes), max(starts or finishes)
            # At least once: a worker killed after a run began and before the next began
            # may have cut the first run's delivery off (its outcome not stored yet); a
            # Redis restart without its data forgets the stored outcome.
            if not any(first <= f <= again for f in restarts + kills):
                found.append(f"ran twice: idempotent {token} ran to its end {len(finishes)} times")
        if died is not None:
            late = [
                t
                for t in starts
                if t > died + _DEAD_CALLER_BOUND
                # A Redis that cannot be asked lets a call run (docs/guarantees.md): one
                # that started during an outage after the death, or as its looks resumed.
                and not any(a < t <= e + _DEAD_CALLER_BOUND and e > died for a, e in outages)
            ]
            if late:
                found.append(
                    f"started after its caller died: {token} started {max(late) - died:.2f} s after"
                )
            continue  # nobody hears a dead caller's calls
        end = ended.get(token)
        if end is None:
            found.append(f"lost: {tool} {token}, sent at +{at - began:.1f} s, never answered")
            continue
        outcome, heard = end["outcome"], float(end["at"])
        took = float(end["took"])
        if took > deadline + _LATE:
            found.append(
                f"late: {tool} {token} heard {outcome} {took - deadline:.2f} s past its deadline"
            )
        if outcome.startswith(("untyped", "wrong result")):
            found.append(f"untyped: {tool} {token}: {outcome}")
        elif outcome == "CallerGone":
            found.append(f"CallerGone to a live caller: {tool} {token} ({end['call_id']})")
        elif outcome == "WorkerLost" and not any(at <= k <= heard for k in kills):
            found.append(
                f"WorkerLost with no worker killed while it lived: {tool} {token} "
                f"({end['call_id']})"
            )
        if (
            outcome in ("WorkerLost", "ToolOutcomeUnknown")
            and tool != "chaos_alo"
            and any(t > heard for t in starts)
        ):
            found.append(
                f"started after it was given up: {tool} {token} ({end['call_id']}), told {outcome}"
            )
        elif (
            outcome == "ToolTimeoutError"
            and finishes
            and min(finishes) < at + deadline - 1.0
            and not any(
                # A reply the restart forgot is noticed two steady looks after Redis is back,
                # and steady: each Redis fault close behind it starts the count again.
                min(finishes) <= r and at + deadline - settled[r] < _REPLY_FORGOTTEN_NOTICED
                for r in restarts
            )
        ):
            found.append(
                f"timeout for a call that had ended: {tool} {token} ({end['call_id']}) ended "
                f"{at + deadline - min(finishes):.2f} s before its deadline"
            )
    return found


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench chaos", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seeds", type=int, default=20, help="how many seeds to run")
    parser.add_argument("--first-seed", type=int, default=1, help="the first seed")
    parser.add_argument(
        "--seconds", type=float, default=30.0, help="seconds of load and faults per seed"
    )
    parser.add_argument("--callers", type=int, default=2, help="caller processes at once")
    parser.add_argument("--in-flight", type=int, default=20, help="calls in flight per caller")
    parser.add_argument("--deadline", type=float, default=8.0, help="each call's deadline (s)")
    parser.add_argument("--show", type=int, default=20, help="violations printed per seed at most")
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=_FAULTS,
        metavar="FAULT",
        help=f"leave this fault out of the schedule (repeatable); the faults: {', '.join(_FAULTS)}",
    )
    parser.add_argument(
        "--keep", type=Path, metavar="DIR", help="work in DIR and keep it (logs, outcomes)"
    )
    return parser
