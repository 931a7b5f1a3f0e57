"""The one wait loop, driven by a sync caller or an async one.

A call's life on the client is written once, as a generator (:data:`Attempts`): it
starts an attempt, yields the future of its outcome, receives the outcome, and either
returns the result or starts another attempt (a joined execution that expired unrun).
Two small drivers wait on the yielded futures with the caller's deadline: a thread
blocks on ``future.result(left)`` (:func:`drive_sync`); a coroutine awaits the future
with a timer on its own loop (:func:`drive_async`), exact and with no thread or task
per call. Exact takes more than one timer where the wait is long: Linux lets an event
loop's wait end up to 0.1% of its timeout late (the kernel's timer slack for
``epoll_wait``: a 5 s deadline 5 ms late, a minute's 60 ms), so the timer first wakes a
little before the deadline and then waits out the short rest (:class:`_Expiry`). At the
deadline the driver throws :class:`ToolTimeoutError` into the generator, whose cleanup
forgets the call, and the error reaches the caller (the client turns it into the error
that says how far the send got). An outcome that arrives only as the deadline passes is
treated the same way: no call returns after its deadline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Generator
from typing import Any, cast

from agent_client._futures import Waiter, settle
from agent_client.errors import ToolTimeoutError
from wire.models import CallOutcome

__all__ = ["Attempts", "drive_async", "drive_sync"]

#: Yields the future of each attempt's outcome, receives the outcome, returns the result.
Attempts = Generator[Waiter, CallOutcome, Any]


def drive_sync(
    attempts: Attempts, *, ends: float | None, clock: Callable[[], float], timed_out: Callable[[], ToolTimeoutError]
) -> Any:
    """Run ``attempts`` on this thread, blocking on each future until ``ends``."""
    try:
        future = next(attempts)
        while True:
            left = None if ends is None else max(0.0, ends - clock())
            try:
                outcome = cast("concurrent.futures.Future[CallOutcome]", future).result(left)
            except concurrent.futures.TimeoutError:
                future = attempts.throw(_quiet(timed_out()))
                continue
            except BaseException as exc:  # noqa: BLE001 - the loop's cleanup runs, then it propagates
                future = attempts.throw(exc)
                continue
            if ends is not None and clock() >= ends:
                # It arrived, but only as the deadline passed: no result after the deadline.
                future = attempts.throw(_quiet(timed_out()))
                continue
            future = attempts.send(outcome)
    except StopIteration as stop:
        return stop.value


async def drive_async(
    attempts: Attempts, *, ends: float | None, timed_out: Callable[[], ToolTimeoutError]
) -> Any:
    """Run ``attempts`` on the running loop; ``ends`` is in that loop's time."""
    loop = asyncio.get_running_loop()
    try:
        future = next(attempts)
        while True:
            # The loop's own timer ends the wait: exact, and no task or thread per call.
            expiry = None if ends is None else _Expiry(loop, ends, future)
            try:
                outcome = await cast("asyncio.Future[CallOutcome]", future)
            except _DeadlinePassed:
                future = attempts.throw(_quiet(timed_out()))
                continue
            except BaseException as exc:  # noqa: BLE001 - cancellation too: cleanup, then propagate
                future = attempts.throw(exc)
                continue
            finally:
                if expiry is not None:
                    expiry.cancel()
            if ends is not None and loop.time() >= ends:
                future = attempts.throw(_quiet(timed_out()))  # no result after the deadline
                continue
            future = attempts.send(outcome)
    except StopIteration as stop:
        return stop.value


class _DeadlinePassed(Exception):
    pass


#: How far before the deadline a long wait's first timer is set, as a share of the time
#: left: twice the most the kernel lets that wait end late (0.1%), so it wakes early.
EARLY_SHARE = 0.002
#: The loop's selector waits in whole milliseconds, rounded up: one more is taken off.
SELECT_RESOLUTION = 0.001
#: Up to this much time left, one timer: its slack (0.1%, under a millisecond) is no
#: more than what a second, short wait costs in the selector's rounding.
ONE_TIMER_WITHIN = 0.75


class _Expiry:
    """Settles ``future`` with :class:`_DeadlinePassed` at ``ends`` on ``loop``'s clock.

    A wait longer than :data:`ONE_TIMER_WITHIN` is cut short by :data:`EARLY_SHARE` of
    itself and :data:`SELECT_RESOLUTION`, and set again from where it woke, until what
    is left is short: a 60 s deadline's timer wakes about 60 ms before it, and the
    timer set then ends late by what a 60 ms wait does (the selector's millisecond),
    not by the 60 ms one timer for the whole minute would.
    """

    __slots__ = ("_ends", "_future", "_handle", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, ends: float, future: Waiter) -> None:
        self._loop, self._ends, self._future = loop, ends, future
        self._handle = self._arm()

    def _arm(self) -> asyncio.TimerHandle:
        left = self._ends - self._loop.time()
        if left > ONE_TIMER_WITHIN:
            return self._loop.call_at(self._ends - left * EARLY_SHARE - SELECT_RESOLUTION, self._again)
        return self._loop.call_at(self._ends, _expire, self._future)

    def _again(self) -> None:
        self._handle = self._arm()

    def cancel(self) -> None:
        self._handle.cancel()


def _expire(future: Waiter) -> None:
    settle(future, error=_DeadlinePassed())


def _quiet(error: ToolTimeoutError) -> ToolTimeoutError:
    # Raised for the deadline, not "during handling" of the wait's internal signal.
    error.__suppress_context__ = True
    return error
