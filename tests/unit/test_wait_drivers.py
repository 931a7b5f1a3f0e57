"""agent_client.wait: an outcome that arrives only as the deadline passes is a timeout.

The drivers wait on a future with the caller's deadline. A reply can land at the very
moment the deadline passes, or the waiting thread can be scheduled late; either way no
call may return a result (or a remote error) after its deadline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import Any

import pytest

from agent_client._futures import Waiter
from agent_client.errors import ToolTimeoutError
from agent_client.wait import Attempts, drive_async, drive_sync
from wire.models import CallOutcome


def _one_attempt(future: Waiter, seen: list[str]) -> Attempts:
    try:
        outcome = yield future
    except ToolTimeoutError:
        seen.append("timed out")
        raise
    finally:
        seen.append("cleaned up")
    return outcome.result


def _timed_out() -> ToolTimeoutError:
    return ToolTimeoutError("probe", 1.0)


def test_a_sync_result_that_arrives_as_the_deadline_passes_is_a_timeout() -> None:
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    future.set_result(CallOutcome(call_id="c", ok=True, result=42))
    now = iter([5.0, 10.0])  # before the wait: 5 s left; after it: the deadline has passed
    seen: list[str] = []

    with pytest.raises(ToolTimeoutError):
        drive_sync(_one_attempt(future, seen), ends=10.0, clock=lambda: next(now), timed_out=_timed_out)

    assert seen == ["timed out", "cleaned up"]


def test_a_sync_result_before_the_deadline_is_returned() -> None:
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    future.set_result(CallOutcome(call_id="c", ok=True, result=42))
    now = iter([5.0, 9.999])

    assert drive_sync(_one_attempt(future, []), ends=10.0, clock=lambda: next(now), timed_out=_timed_out) == 42


def test_an_async_result_that_arrives_as_the_deadline_passes_is_a_timeout() -> None:
    async def late() -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        ends = loop.time() + 0.05
        # The reply lands just before the deadline, but the loop is busy (a callback that
        # blocks it) until after it: the waiting call wakes up late, with a result.
        loop.call_at(ends - 0.02, future.set_result, CallOutcome(call_id="c", ok=True, result=42))
        loop.call_at(ends - 0.02, time.sleep, 0.04)  # a busy loop, not a wait for a condition
        seen: list[str] = []
        with pytest.raises(ToolTimeoutError):
            await drive_async(_one_attempt(future, seen), ends=ends, timed_out=_timed_out)
        assert seen == ["timed out", "cleaned up"]

    asyncio.run(late())
