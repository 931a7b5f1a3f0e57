"""Where a worker's time goes under load, by stage of a call: ``python -m bench.profile``.

A real Redis and a real worker run (``--pool``, ``-c``); this process keeps ``--in-flight``
no-op calls going for ``--seconds`` while py-spy samples the worker (its pool children
too) in every thread, ``--rate`` times a second. Each sample a thread spent working (not
waiting in ``epoll``, a lock or a queue: py-spy's idle samples are left out) is put in the
stage of the deepest frame it has in a module of the table below (:data:`STAGES`), else in
``other``. The table gives, per process and thread, the milliseconds each stage took per
call (samples / rate / calls), so that a cut is made where it shows.

py-spy's samples are of wall time while a thread runs Python or a system call; a thread
that waits for the interpreter's lock counts as running. Figures move from run to run on
a shared machine; compare stages within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory

from toolexec import Pool

__all__ = ["STAGES", "Profile", "classify", "main", "parse"]

#: The stages of a call in a worker, each named by the module paths of its frames; a
#: sample's stage is that of its deepest frame found here (earlier rows win a tie).
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("deliver the outcome", ("executor/delivery.py", "executor/claims.py")),
    ("run the call", ("executor/task.py", "executor/runner.py", "executor/context.py")),
    ("acknowledge", ("kombu/message.py",)),
    (
        "Celery's request and strategy",
        (
            "celery/worker/request.py",
            "celery/worker/strategy.py",
            "executor/seams/request.py",
            "executor/seams/consumer.py",
            "celery/worker/consumer/consumer.py",
            "kombu/messaging.py",
        ),
    ),
    (
        "read and decode the queue",
        ("kombu/transport/", "executor/seams/transport.py", "executor/pools/reads.py"),
    ),
    (
        "hand over to the pool",
        (
            "celery/concurrency/asynpool.py",
            "billiard/",
            "executor/pools/asyncio_pool.py",
            "executor/pools/trace.py",
            "executor/pools/offload.py",
        ),
    ),
    ("event loop", ("kombu/asynchronous/", "asyncio/")),
)
OTHER = "other"
#: A sample whose innermost frame is one of these waits (for a socket, a lock, a queue,
#: a timer), though py-spy took it for running: left out.
WAITING = (
    "poll (",
    "select (",
    ".wait (",
    ".get (",
    "sleep (",
    "concurrent/futures/thread.py:8",  # an idle executor thread, in its queue's get
    "read_from_socket (",  # redis-py waiting for a reply
    "Connection._recv (",  # a prefork child waiting for its next job
)


@dataclass(frozen=True)
class Profile:
    """Samples by (process, thread) and stage, and what they were taken over."""

    samples: dict[tuple[str, str], collections.Counter[str]]
    rate: int
    calls: int

    def ms_per_call(self, count: int) -> float:
        return count / self.rate / self.calls * 1000 if self.calls else float("nan")


def classify(frames: Sequence[str]) -> str:
    """The stage of a sample whose frames run from the outermost to the innermost."""
    for frame in reversed(frames):
        for stage, paths in STAGES:
            if any(path in frame for path in paths):
                return stage
    return OTHER


def parse(raw: str, root_pid: int) -> dict[tuple[str, str], collections.Counter[str]]:
    """py-spy's raw (collapsed) samples, ``--subprocesses --threads``, by process role and
    thread name, and stage."""
    found: dict[tuple[str, str], collections.Counter[str]] = collections.defaultdict(
        collections.Counter
    )
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        process, thread, rest = "", "", frames
        while rest and rest[0].startswith("process "):
            process, rest = rest[0], rest[1:]
        if rest and rest[0].startswith("thread "):
            thread, rest = rest[0], rest[1:]
        pid = process.removeprefix("process ").split(":", 1)[0]
        role = "main process" if pid in ("", str(root_pid)) else "child process"
        name = thread.rpartition(")")[2].strip(": ") or thread
        if role == "child process":
            name = "(every child)"  # prefork's pool children; the keeper of the other pools
        if rest and any(marker in rest[-1] for marker in WAITING):
            continue
        found[(role, _thread_name(name))][classify(rest)] += int(count)
    return dict(found)


def _thread_name(name: str) -> str:
    # Numbered threads of one kind are one row: toolexec-tool_3 -> toolexec-tool_*.
    head, sep, tail = name.rpartition("_")
    if sep and tail.isdigit():
        return f"{head}_*"
    head, sep, tail = name.rpartition("-")
    if sep and tail.isdigit():
        return f"{head}-*"
    return name


def measure(pool: Pool, concurrency: int, in_flight: int, seconds: float, rate: int) -> Profile:
    """Profile a worker of ``pool`` while ``in_flight`` no-op calls keep going."""
    from agent_client import configure, remote_tool
    from bench.stats import keep_in_flight
    from toolexec.redis_server import RedisServer
    from toolexec.worker_process import WorkerProcess
    from wire.settings import Settings

    with (
        TemporaryDirectory(prefix="toolexec-profile-") as tmp,
        RedisServer(directory=tmp) as server,
    ):
        env = {
            "TOOLEXEC_BROKER_URL": server.url,
            "TOOLEXEC_REDIS_URL": server.url,
            "TOOLEXEC_TOOL_MODULES": "bench.tools",
        }
        worker = WorkerProcess(
            name="profiled", pool=pool, concurrency=concurrency, env=env, log_dir=tmp
        )
        client = configure(Settings.from_env({**os.environ, **env}))
        try:
            with worker:
                assert worker.pid is not None
                noop = remote_tool("noop", timeout=60)

                def call() -> Awaitable[object]:
                    return noop.invoke({})

                asyncio.run(keep_in_flight(call, in_flight, 4 * in_flight))  # warm
                out = Path(tmp) / "samples.txt"
                spy = _record(worker.pid, out, seconds=seconds, rate=rate)
                calls = asyncio.run(_calls(call, in_flight, spy))
                _, errors = spy.communicate(timeout=60)
                if spy.returncode != 0 or not out.exists():
                    raise RuntimeError(f"py-spy failed: {errors.decode(errors='replace')}")
                return Profile(parse(out.read_text(), worker.pid), rate, calls)
        finally:
            client.close()


def _record(pid: int, out: Path, *, seconds: float, rate: int) -> subprocess.Popen[bytes]:
    """py-spy recording process ``pid`` and its children, every thread, into ``out``."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    argv = [py_spy, "record", "--pid", str(pid), "--rate", str(rate)]
    argv += ["--duration", str(max(1, int(seconds))), "--format", "raw", "--output", str(out)]
    argv += ["--threads", "--subprocesses", "--nonblocking"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def _calls(
    call: Callable[[], Awaitable[object]], in_flight: int, spy: subprocess.Popen[bytes]
) -> int:
    """Keep ``in_flight`` calls going until py-spy stops; the calls that ended meanwhile."""
    done = 0

    async def lane() -> None:
        nonlocal done
        while spy.poll() is None:
            await call()
            done += 1

    await asyncio.gather(*(lane() for _ in range(in_flight)))
    return done


def render(profile: Profile, title: str) -> str:
    """The profile as a Markdown table: ms per call by process, thread and stage."""
    stages = [stage for stage, _ in STAGES] + [OTHER]
    lines = [
        f"{title}: {profile.calls:,} calls; worker time per call, ms, by thread and stage",
        "",
        "| process | thread | " + " | ".join(stages) + " | all |",
        "|---|---|" + "---|" * (len(stages) + 1),
    ]
    totals: collections.Counter[str] = collections.Counter()
    rows = sorted(profile.samples.items(), key=lambda item: -sum(item[1].values()))
    for (role, thread), counts in rows:
        totals.update(counts)
        cells = [f"{profile.ms_per_call(counts[stage]):.3f}" for stage in stages]
        all_ms = profile.ms_per_call(sum(counts.values()))
        lines.append(f"| {role} | {thread} | " + " | ".join(cells) + f" | {all_ms:.3f} |")
    cells = [f"{profile.ms_per_call(totals[stage]):.3f}" for stage in stages]
    all_ms = profile.ms_per_call(sum(totals.values()))
    lines.append("| all | | " + " | ".join(cells) + f" | {all_ms:.3f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--pool", default="asyncio", choices=("asyncio", "prefork"))
    parser.add_argument("-c", "--concurrency", type=int, default=None)
    parser.add_argument("--in-flight", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=200, help="samples per second")
    args = parser.parse_args(argv)
    concurrency = args.concurrency or (100 if args.pool == "asyncio" else 2)
    started = time.monotonic()
    pool: Pool = "asyncio" if args.pool == "asyncio" else "prefork"
    profile = measure(pool, concurrency, args.in_flight, args.seconds, args.rate)
    title = f"{args.pool} -c {concurrency}, {args.in_flight} in flight, {args.seconds:g} s"
    print(render(profile, title))
    print(f"\nTook {time.monotonic() - started:.1f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
