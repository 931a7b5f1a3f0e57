"""executor.runner and executor.limits: what a hard limit can stop, and tools that exit.

A sync tool runs in a thread, which cannot be stopped: past its hard limit it is
abandoned and counted (``runaways()``), and a prefork pool child then retires
(``retire_if_runaway``). An async tool is cancelled at its hard limit; one that ignores
the cancellation is abandoned with its event loop, which never runs again, so it never
resumes. ``sys.exit``, ``KeyboardInterrupt`` and a tool's own ``CancelledError`` are
answered as the tool's error instead of ending the worker process without a reply.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import threading
import time
from typing import Any

import pytest

from executor import limits, worker
from executor.errors import ProcessRetired
from executor.limits import retire_if_runaway, runaways
from executor.runner import execute
from wire.models import CallOutcome, CallRequest, ErrorKind

from .conftest import Register
from .support import wait_until


def run(name: str, **arguments: Any) -> CallOutcome:
    return execute(CallRequest(call_id="call-1", tool=name, arguments=arguments), worker="w@host")


def error_of(outcome: CallOutcome) -> tuple[ErrorKind, str, str]:
    assert outcome.error is not None, outcome
    return outcome.error.kind, outcome.error.type, outcome.error.message


@pytest.mark.parametrize("code", [0, 3, "bye"])
def test_a_sync_tool_that_calls_sys_exit_gets_an_execution_error_naming_system_exit(
    register: Register, code: Any
) -> None:
    def leave() -> None:
        """Exit."""
        sys.exit(code)

    kind, type_name, message = error_of(run(register(leave)))

    assert (kind, type_name) == (ErrorKind.EXECUTION, "SystemExit")
    assert f"called sys.exit({code!r})" in message


@pytest.mark.parametrize("hard_timeout", [None, 5.0])
def test_an_async_or_bounded_tool_that_calls_sys_exit_gets_the_same_error(
    register: Register, hard_timeout: float | None
) -> None:
    async def leave_async() -> None:
        """Exit."""
        await asyncio.sleep(0)
        sys.exit(2)

    def leave_sync() -> None:
        """Exit."""
        sys.exit(2)

    for func in (leave_async, leave_sync):
        kind, type_name, message = error_of(run(register(func, hard_timeout=hard_timeout)))
        assert (kind, type_name) == (ErrorKind.EXECUTION, "SystemExit")
        assert "called sys.exit(2)" in message


def test_an_async_tool_that_exits_leaves_its_threads_loop_serving_and_no_task_unretrieved(
    register: Register, caplog: pytest.LogCaptureFixture
) -> None:
    async def leave() -> None:
        """Exit."""
        await asyncio.sleep(0)
        sys.exit(2)

    async def answer() -> str:
        """Answer."""
        await asyncio.sleep(0)
        return "still here"

    with caplog.at_level(logging.ERROR):
        for hard_timeout in (None, 5.0):
            assert error_of(run(register(leave, hard_timeout=hard_timeout)))[1] == "SystemExit"
            gc.collect()  # an unretrieved task exception is logged when the task is collected
        later = run(register(answer))

    assert (later.ok, later.result) == (True, "still here")
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


def test_keyboard_interrupt_and_a_tools_own_cancellation_are_its_errors(register: Register) -> None:
    def interrupt() -> None:
        """Interrupt."""
        raise KeyboardInterrupt

    async def cancel_itself() -> None:
        """Cancel."""
        raise asyncio.CancelledError("gave up")

    assert error_of(run(register(interrupt)))[:2] == (ErrorKind.EXECUTION, "KeyboardInterrupt")
    kind, type_name, message = error_of(run(register(cancel_itself, hard_timeout=5.0)))
    assert (kind, type_name) == (ErrorKind.EXECUTION, "CancelledError")
    assert "gave up" in message


def test_a_sync_tool_past_its_hard_limit_is_abandoned_counted_until_it_returns_and_said_so(
    register: Register,
) -> None:
    release, finished = threading.Event(), threading.Event()

    def spin() -> None:
        """Spin until released."""
        while not release.is_set():
            pass
        finished.set()

    before = runaways()
    try:
        kind, type_name, message = error_of(run(register(spin, hard_timeout=0.2)))
        assert (kind, type_name) == (ErrorKind.HARD_TIMEOUT, "ToolHardTimeout")
        assert (
            "its thread cannot be stopped on this pool and runs on" in message
        )  # not a pool child
        assert runaways() == before + 1
    finally:
        release.set()
    assert finished.wait(5)
    assert wait_until(lambda: runaways() == before)  # is_alive() turns false just after


def test_an_async_tool_that_ignores_cancellation_is_abandoned_with_its_loop_and_never_resumes(
    register: Register,
) -> None:
    steps: list[int] = []
    release = threading.Event()

    async def stubborn() -> str:
        """Ignore cancellation until released."""
        while not release.is_set():
            try:
                await asyncio.sleep(0.01)
                steps.append(1)
            except asyncio.CancelledError:
                continue
        return "done"

    async def quick() -> str:
        """Return at once."""
        return "quick"

    name = register(stubborn, hard_timeout=0.2)
    before = runaways()
    started = time.monotonic()
    kind, type_name, message = error_of(run(name))
    elapsed = time.monotonic() - started

    assert (kind, type_name) == (ErrorKind.HARD_TIMEOUT, "ToolHardTimeout")
    assert message.endswith("and was stopped")
    assert 0.2 + limits._CANCEL_GRACE <= elapsed < 0.2 + limits._CANCEL_GRACE + 1.0
    assert runaways() == before + 1
    frozen = len(steps)
    # The next async call on this thread gets a fresh loop; the abandoned one never runs.
    assert run(register(quick)).result == "quick"
    assert len(steps) == frozen
    # Taking a fresh loop closed the abandoned one (nothing of it is left to the garbage
    # collector), so its task can never resume; it stays referenced, still pending.
    loop, task = limits._abandoned[-1]
    assert loop.is_closed() and not task.done()
    release.set()


def test_an_async_tool_that_honours_cancellation_is_stopped_at_its_hard_limit_and_not_counted(
    register: Register,
) -> None:
    async def sleepy() -> None:
        """Sleep long."""
        await asyncio.sleep(30)

    before = runaways()
    started = time.monotonic()
    kind, type_name, message = error_of(run(register(sleepy, hard_timeout=0.2)))

    assert (kind, type_name) == (ErrorKind.HARD_TIMEOUT, "ToolHardTimeout")
    assert message.endswith("and was stopped")
    assert time.monotonic() - started < 0.2 + limits._CANCEL_GRACE
    assert runaways() == before


def test_a_tools_own_timeout_error_is_its_error_not_the_hard_limit(register: Register) -> None:
    async def times_out() -> None:
        """Time out on its own."""
        raise TimeoutError("upstream slow")

    assert error_of(run(register(times_out, hard_timeout=5.0)))[:2] == (
        ErrorKind.EXECUTION,
        "TimeoutError",
    )


def test_only_a_prefork_child_with_a_runaway_retires(
    register: Register, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()

    def spin() -> None:
        """Spin until released."""
        while not release.is_set():
            pass

    retire_if_runaway()  # the worker's own process, nothing running away: stays
    try:
        run(register(spin, hard_timeout=0.1))
        retire_if_runaway()  # a runaway, but this is the worker's process (solo, threads): stays
        monkeypatch.setattr(worker, "_main_pid", os.getpid() + 1)  # now a pool child
        with pytest.raises(ProcessRetired):
            retire_if_runaway()
    finally:
        release.set()
