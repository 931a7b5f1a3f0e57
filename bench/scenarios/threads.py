"""3. Threads in the agent process while 1,000 calls are in flight, and after they time out.

toolexec waits on one reply listener per process, so neither the number in flight nor
the number abandoned should show in the thread count. LazyBridge's in-process
``Tool(timeout=)`` runs each synchronous call in a thread of its own and, at the
deadline, abandons it: the thread runs on until the call returns by itself.

Each side makes N calls whose deadline passes while the work is still going, samples
the process's OS threads (``/proc/self/task``) while they are in flight, and counts
again after every caller has its timeout error.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import lazybridge

from agent_client import ToolClient, ToolTimeoutError, remote_tool
from bench import names
from bench.harness import Bench
from bench.report import Goal, ScenarioResult, Table, count

NUMBER = 3
TITLE = "Threads in the agent process: 1,000 in flight, then 1,000 timeouts"

#: The callers' deadline; the work takes longer than this.
_DEADLINE = 1.0
_HOLD_MS = 1500
_SETTLE = 0.5


@dataclass(frozen=True, kw_only=True)
class _Counts:
    cold: int  # before the side's first call
    warm: int  # after one call that returned (a listener, if any, is running)
    peak: int  # most seen while the calls were in flight
    settled: int  # _SETTLE seconds after the last caller got its timeout
    timeouts: int


def os_threads() -> int:
    """Threads of this process as the OS counts them (Python's view where there is no /proc)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def run(bench: Bench) -> ScenarioResult:
    """Count threads for toolexec and for LazyBridge's in-process timeout."""
    n = bench.sizes.thread_calls
    measured = {
        "toolexec (asyncio, remote tool)": _toolexec(bench, n),
        "LazyBridge Tool(timeout=) in-process": _lazybridge(bench, n),
    }
    rows = [
        (
            side,
            count(c.cold),
            f"+{c.peak - c.cold}",
            f"+{c.settled - c.cold}",
            f"{c.settled - c.warm}",
            f"{c.timeouts:,}/{n:,}",
        )
        for side, c in measured.items()
    ]
    toolexec = measured["toolexec (asyncio, remote tool)"]
    extra, left = toolexec.peak - toolexec.cold, toolexec.settled - toolexec.warm
    columns = (
        "side",
        "threads before",
        f"extra while {n:,} in flight",
        f"extra {_SETTLE:g} s after the timeouts",
        "left behind by the timeouts",
        "timed out",
    )
    return ScenarioResult(
        number=NUMBER,
        title=TITLE,
        tables=[Table(columns=columns, rows=rows)],
        goals=[
            Goal(
                name=f"toolexec extra threads, {n:,} in flight",
                measured=f"+{extra}",
                target="≤ +4",
                met=extra <= 4,
            ),
            Goal(
                name=f"toolexec threads left behind by {n:,} timeouts",
                measured=str(left),
                target="0",
                met=left <= 0,
            ),
        ],
        notes=[
            f"Every call's deadline is {_DEADLINE:g} s and its work takes {_HOLD_MS} ms.",
            (
                "'Extra' counts from before the side's first call, so toolexec's one reply "
                "listener is in it."
            ),
            "'Left behind' counts from after one call that returned.",
        ],
    )


def _toolexec(bench: Bench, n: int) -> _Counts:
    # A client of its own, so its listener starts inside the measurement.
    client = ToolClient(bench.settings)
    try:
        sleep = remote_tool("sleep_ms", client=client)
        cold = os_threads()
        sleep.invoke_sync({"ms": 0}, timeout=10.0)
        counts = bench.run(
            _measure(lambda: sleep.invoke({"ms": _HOLD_MS}, timeout=_DEADLINE), n, cold)
        )
    finally:
        client.close()
    # The calls that the worker did not reach expired in the queue: it drops them.
    bench.wait_idle([names.TOOLEXEC_QUEUE], settle=_HOLD_MS / 1000)
    return counts


def _lazybridge(bench: Bench, n: int) -> _Counts:
    release = threading.Event()

    def held(ms: int) -> int:
        """Wait like a slow tool, until released."""
        release.wait(ms / 1000)
        return ms

    tool = lazybridge.Tool(held, name="held", timeout=_DEADLINE)
    cold = os_threads()
    with warnings.catch_warnings():
        # LazyBridge warns, rightly, once abandoned threads pile up.
        warnings.simplefilter("ignore")
        bench.run(tool.run(ms=0))
        counts = bench.run(_measure(lambda: tool.run(ms=600_000), n, cold))
    release.set()
    deadline = time.monotonic() + 30
    while os_threads() > counts.warm and time.monotonic() < deadline:
        time.sleep(0.05)
    return counts


async def _measure(call: Callable[[], Awaitable[object]], n: int, cold: int) -> _Counts:
    warm = os_threads()
    peak = warm
    tasks = [asyncio.ensure_future(call()) for _ in range(n)]
    pending = set(tasks)
    while pending:
        peak = max(peak, os_threads())
        _, pending = await asyncio.wait(pending, timeout=0.02)
    await asyncio.sleep(_SETTLE)
    timeouts = sum(
        isinstance(t.exception(), ToolTimeoutError | lazybridge.ToolTimeoutError) for t in tasks
    )
    return _Counts(cold=cold, warm=warm, peak=peak, settled=os_threads(), timeouts=timeouts)
