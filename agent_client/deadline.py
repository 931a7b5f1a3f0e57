"""A call's deadline: how long it may wait, and how its wait ends exactly there.

Precedence, highest first: a timeout given to one call, to ``remote_tool(timeout=)``,
the framework's default (LazyBridge's ``Agent(tool_timeout=)``, ...), the toolset's
``remote_tools(default_timeout=)``, the tool's own ``@tool(timeout=)``, the settings
default (see ``RemoteTool.effective_timeout``).
``None`` at any level means "no deadline" and wins like any other value; only
:data:`NOT_SET` defers to the next level.

A deadline counts from when the call was made: a caller that does work of its own
first (the MCP server reading the catalog for a tool it had not seen) passes that
moment on as ``started``, and :func:`time_left` says what remains.

The wait is written once, as a generator (:data:`Attempts`, the client's
``ToolClient.attempts``): it starts an attempt, yields the future of its outcome,
receives the outcome, and either returns the result or starts another attempt (a
joined execution that expired unrun). Every call runs that one loop; what differs is
who drives it. A call awaited at once (``invoke``, ``run``, a framework's tool call) is
driven by its caller, with the caller's deadline: a thread blocks on
``future.result(left)`` (:func:`drive_sync`); a coroutine awaits the future with a
timer on its own loop (:func:`drive_async`), exact and with no thread or task per call.
A held call (``submit``: a ``CallHandle`` nobody may be waiting on) is driven by
callbacks (:class:`HeldDrive`): each outcome is sent in where it arrives, the deadline
is thrown in by a timer or by a waiter that saw it pass, and the end is handed over once.

Exact takes more than one timer where the wait is long: Linux lets an event loop's wait
end up to 0.1% of its timeout late (the kernel's timer slack for ``epoll_wait``: a 5 s
deadline 5 ms late, a minute's 60 ms), so the timer first wakes a little before the
deadline and then waits out the short rest (:class:`_Expiry`). At the deadline the driver throws
:class:`ToolTimeoutError` into the generator, whose cleanup forgets the call, and the
error reaches the caller (the client turns it into the error that says how far the
send got). An outcome that arrives only as the deadline passes is treated the same
way: no call returns after its deadline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import math
import threading
import time
from collections.abc import Callable, Generator
from typing import Any, Final, TypeAlias, cast

from agent_client._io.loop import Waiter, settle
from agent_client.errors import ToolTimeoutError
from wire.models import MAX_TIMEOUT, CallOutcome

__all__ = [
    "NOT_SET",
    "NotSet",
    "Timeout",
    "check_timeout",
    "resolve_timeout",
    "time_left",
    "Attempts",
    "HeldDrive",
    "drive_async",
    "drive_sync",
]


class NotSet(enum.Enum):
    """Type of :data:`NOT_SET`."""

    NOT_SET = "NOT_SET"

    def __repr__(self) -> str:
        return "NOT_SET"


#: "Use the next level's value": distinct from ``None``, which means no deadline.
NOT_SET: Final = NotSet.NOT_SET

Timeout: TypeAlias = "float | None | NotSet"


def check_timeout(value: Timeout, *, what: str = "timeout") -> Timeout:
    """Return ``value`` if it is NOT_SET, None or a positive finite number; else raise."""
    if value is NOT_SET or value is None:
        return value
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(
            f"{what} must be a positive number of seconds, None (no deadline) or NOT_SET; got "
            f"{value!r}"
        )
    if value > MAX_TIMEOUT:
        raise ValueError(
            f"{what} must be at most {MAX_TIMEOUT:.0f} seconds (366 days), or None for no "
            f"deadline; got {value!r}"
        )
    return float(value)


def resolve_timeout(*levels: Timeout) -> float | None:
    """The first level that is set, highest first; None (no deadline) if none is."""
    for level in levels:
        if level is not NOT_SET:
            return None if level is None else float(level)
    return None


def time_left(timeout: float | None, started: float | None) -> float | None:
    """Seconds left of ``timeout`` counted from ``started`` (a ``time.monotonic()`` reading).

    None means no deadline; ``started`` None counts from now. Zero or less: it passed.
    """
    if timeout is None or started is None:
        return timeout
    return timeout - (time.monotonic() - started)


# -- waiting until the deadline -------------------------------------------------------

#: Yields the future of each attempt's outcome, receives the outcome, returns the result.
Attempts = Generator[Waiter, CallOutcome, Any]


def drive_sync(
    attempts: Attempts,
    *,
    ends: float | None,
    clock: Callable[[], float],
    timed_out: Callable[[], ToolTimeoutError],
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


class HeldDrive:
    """Drives ``attempts`` by callbacks, for a call nobody has to be waiting on.

    :meth:`start` takes the first step on the caller's thread (a call refused before
    any I/O raises there); then each attempt's outcome is sent in by the callback of its
    future, wherever that future is settled, and :meth:`expire` throws the deadline in
    (the I/O thread's timer, or a waiter that saw the deadline pass first). An outcome
    that arrives once the deadline passed counts as the deadline, as in the drivers that
    wait. ``ended`` gets the result, or the error, exactly once.
    """

    __slots__ = ("_attempts", "_clock", "_ended", "_ends", "_lock", "_over", "_timed_out")

    def __init__(
        self,
        attempts: Attempts,
        *,
        ends: float | None,
        clock: Callable[[], float],
        timed_out: Callable[[], ToolTimeoutError],
        ended: Callable[[Any, BaseException | None], None],
    ) -> None:
        self._attempts, self._ends, self._clock = attempts, ends, clock
        self._timed_out, self._ended = timed_out, ended
        self._lock = threading.Lock()  # the generator runs on one thread at a time
        self._over = False

    def start(self) -> None:
        """Start the first attempt; its errors before any I/O raise here."""
        with self._lock:
            future = next(self._attempts)
        future.add_done_callback(self._arrived)

    def expire(self) -> None:
        """The deadline passed: end the call with the error that says how far it got."""
        self._step(error=_quiet(self._timed_out()))

    def close(self) -> None:
        """Give the call up with no end handed over (its submit raised instead)."""
        with self._lock:
            if not self._over:
                self._over = True
                self._attempts.close()

    def _arrived(self, future: Waiter) -> None:
        if future.cancelled():
            return  # given up: the deadline's step ends the call
        error = future.exception()
        if error is not None:
            self._step(error=error)
        elif self._ends is not None and self._clock() >= self._ends:
            self._step(error=_quiet(self._timed_out()))  # no result after the deadline
        else:
            self._step(outcome=future.result())

    def _step(
        self, *, outcome: CallOutcome | None = None, error: BaseException | None = None
    ) -> None:
        with self._lock:
            if self._over:
                return
            try:
                if error is not None:
                    future = self._attempts.throw(error)
                else:
                    future = self._attempts.send(cast("CallOutcome", outcome))
            except StopIteration as stop:
                self._over = True
                ended: tuple[Any, BaseException | None] | None = (stop.value, None)
            except BaseException as exc:  # noqa: BLE001 - the call's error, handed over
                self._over = True
                ended = (None, exc)
            else:
                ended = None
        if ended is not None:
            self._ended(*ended)
        else:  # another attempt: outside the lock, as a settled future calls back at once
            future.add_done_callback(self._arrived)


class _DeadlinePassed(Exception):
    pass


#: How far before the deadline a long wait's first timer is set, as a share of the time
#: left. Linux lets such a wait end late by 0.1% of it (the timer slack of ``epoll_wait``);
#: on virtual machines up to 0.3% was seen. Ten times the first, so it wakes early.
EARLY_SHARE = 0.01
#: The loop's selector waits in whole milliseconds, rounded up: one more is taken off.
SELECT_RESOLUTION = 0.001
#: Up to this much time left, one timer: its slack (0.3% at most: 0.3 ms) is no more
#: than what a second, short wait costs in the selector's rounding.
ONE_TIMER_WITHIN = 0.1


class _Expiry:
    """Settles ``future`` with :class:`_DeadlinePassed` at ``ends`` on ``loop``'s clock.

    A wait longer than :data:`ONE_TIMER_WITHIN` is cut short by :data:`EARLY_SHARE` of
    itself and :data:`SELECT_RESOLUTION`, and set again from where it woke, until what
    is left is short: a 60 s deadline's timer wakes about 0.6 s before it, the next one
    about 6 ms before it, and the timer set then ends late by what a 6 ms wait does (the
    selector's millisecond), not by the 60 to 180 ms one timer for the whole minute would.
    """

    __slots__ = ("_ends", "_future", "_handle", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, ends: float, future: Waiter) -> None:
        self._loop, self._ends, self._future = loop, ends, future
        self._handle = self._arm()

    def _arm(self) -> asyncio.TimerHandle:
        left = self._ends - self._loop.time()
        if left > ONE_TIMER_WITHIN:
            return self._loop.call_at(
                self._ends - left * EARLY_SHARE - SELECT_RESOLUTION, self._again
            )
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
