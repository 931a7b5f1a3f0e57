"""Which of toolexec's modules one plain call passes, on each side: ``python -m bench.call_path``.

A real Redis and a real solo worker run; the worker's interpreter and this one record, in
every thread, when each function of a product module (``agent_client``, ``executor``,
``wire``) was called (a trace hook told of Python calls only, installed before anything
of the project is imported). This process then makes plain calls of a no-op tool one at
a time: a module is on a call's path when a function of it ran, in either process,
between the call's start and its return, in every one of the calls measured (so that a
heartbeat or a listener that happened to wake during one call is not counted). The
modules that also ran in an idle stretch as long as a call are marked: they are busy
anyway, and counted only because they ran in every call too.

It measures the shape of the code, not its speed: the hook slows both processes down.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import json
import os
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from tempfile import TemporaryDirectory
from types import FrameType
from typing import Any

__all__ = ["main"]

#: The packages whose modules are counted.
PACKAGES = ("agent_client", "executor", "wire")
#: Calls measured by default (a module counts when it ran in every one).
CALLS = 5
#: Moments remembered per module: enough for a measured run, bounded for a long one.
KEPT = 20_000

_times: dict[str, collections.deque[float]] = collections.defaultdict(
    lambda: collections.deque(maxlen=KEPT)
)


def _hook(frame: FrameType, event: str, arg: Any) -> None:
    # A trace function told only of Python calls: it returns None, so no line of the
    # function called is traced (and, unlike a profile hook, no C call is reported).
    name = frame.f_globals.get("__name__", "")
    if name.startswith(PACKAGES):
        _times[name].append(time.monotonic())


def _trace() -> None:
    """Record the call moments of product modules in every thread from now on."""
    threading.settrace(_hook)
    sys.settrace(_hook)


def _untrace() -> None:
    sys.settrace(None)
    threading.settrace(None)


def _in(window: tuple[float, float], times: Iterable[float]) -> bool:
    start, end = window
    return any(start <= moment <= end for moment in times)


def _modules(times: dict[str, Sequence[float]], window: tuple[float, float]) -> set[str]:
    return {name for name, moments in times.items() if _in(window, moments)}


def _traced_worker(celery_argv: list[str]) -> None:
    """Run ``celery`` with the hook, writing what it recorded to $CALL_PATH_OUT at exit."""
    out = Path(os.environ["CALL_PATH_OUT"])

    def dump() -> None:
        _untrace()
        out.write_text(json.dumps({name: list(moments) for name, moments in _times.items()}))

    atexit.register(dump)
    _trace()
    from celery.__main__ import main as celery_main

    sys.argv = ["celery", *celery_argv]
    celery_main()


def measure(calls: int = CALLS) -> dict[str, tuple[set[str], set[str]]]:
    """Make ``calls`` plain calls against a traced solo worker: by side (``agent``,
    ``worker``), the modules that ran in every call, and those that ran while idle."""
    _trace()  # before the project is imported, so that every module is seen
    from agent_client import configure, remote_tool
    from toolexec.redis_server import RedisServer
    from toolexec.worker_process import WorkerProcess
    from wire.settings import Settings

    class TracedWorker(WorkerProcess):
        def argv(self) -> list[str]:
            celery = super().argv()
            assert celery[1:3] == ["-m", "celery"]
            return [sys.executable, "-m", "bench.call_path", "--traced-worker", *celery[3:]]

    with TemporaryDirectory(prefix="toolexec-call-path-") as tmp:
        out = Path(tmp) / "worker.json"
        with RedisServer(directory=tmp) as server:
            env = {
                "TOOLEXEC_BROKER_URL": server.url,
                "TOOLEXEC_REDIS_URL": server.url,
                "TOOLEXEC_TOOL_MODULES": "bench.tools",
                # Beats far apart: a beat seldom falls into a call's few milliseconds.
                "TOOLEXEC_HEARTBEAT_INTERVAL": "30",
                "CALL_PATH_OUT": str(out),
            }
            worker = TracedWorker(name="path", pool="solo", concurrency=1, env=env, log_dir=tmp)
            client = configure(Settings.from_env({**os.environ, **env}))
            try:
                with worker:
                    in_calls, in_idle = _calls(remote_tool("noop", timeout=30), calls)
            finally:
                client.close()
                _untrace()
        worker_times: dict[str, Sequence[float]] = json.loads(out.read_text())
    sides: dict[str, dict[str, Sequence[float]]] = {"agent": dict(_times), "worker": worker_times}
    return {
        side: (
            set.intersection(*(_modules(times, window) for window in in_calls)),
            set.union(*(_modules(times, window) for window in in_idle)),
        )
        for side, times in sides.items()
    }


def _calls(noop: Any, calls: int) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """Each call's stretch of time, and an idle stretch as long after each."""
    for _ in range(3):  # warm: connections, scripts, the catalog
        noop.invoke_sync({})
    in_calls, in_idle = [], []
    for _ in range(calls):
        start = time.monotonic()
        noop.invoke_sync({})
        in_calls.append((start, time.monotonic()))
        time.sleep(0.05)  # a measuring pause: the call's after-work (its reply's trim) ends
        quiet = time.monotonic()
        time.sleep(in_calls[-1][1] - start)
        in_idle.append((quiet, time.monotonic()))
    return in_calls, in_idle


def _report(sides: dict[str, tuple[set[str], set[str]]], calls: int) -> None:
    print(f"modules of {', '.join(PACKAGES)} that ran in each of {calls} plain calls of a no-op")
    print("tool (solo worker), by process; (busy when idle) marks one that ran in an idle stretch")
    for side, (on_path, busy) in sides.items():
        print(f"\n{side} process: {len(on_path)} modules")
        for package in PACKAGES:
            mine = sorted(name for name in on_path if name.split(".")[0] == package)
            if mine:
                print(f"  {package} ({len(mine)}):")
                for name in mine:
                    print(f"    {name}{'  (busy when idle)' if name in busy else ''}")
    print("\nin all, by package:")
    for package in PACKAGES:
        counts = [
            sum(1 for name in on_path if name.split(".")[0] == package)
            for on_path, _ in sides.values()
        ]
        print(f"  {package:<13} agent {counts[0]:>2}   worker {counts[1]:>2}")


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--traced-worker"]:
        _traced_worker(args[1:])
        return
    parser = argparse.ArgumentParser(prog="python -m bench.call_path", description=__doc__)
    parser.add_argument("--calls", type=int, default=CALLS, help="calls measured")
    calls = parser.parse_args(args).calls
    _report(measure(calls), calls)


if __name__ == "__main__":
    main()
