"""agent_client.deadline's wait drivers: an outcome that arrives only as the deadline
passes is a timeout.

The drivers wait on a future with the caller's deadline. A reply can land at the very
moment the deadline passes, or the waiting thread can be scheduled late; either way no
call may return a result (or a remote error) after its deadline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import pytest

from agent_client._io.loop import Waiter
from agent_client.deadline import (
    ONE_TIMER_WITHIN,
    SELECT_RESOLUTION,
    Attempts,
    HeldDrive,
    _Expiry,
    drive_async,
    drive_sync,
)
from agent_client.errors import ToolTimeoutError
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
        drive_sync(
            _one_attempt(future, seen), ends=10.0, clock=lambda: next(now), timed_out=_timed_out
        )

    assert seen == ["timed out", "cleaned up"]


def test_a_sync_result_before_the_deadline_is_returned() -> None:
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    future.set_result(CallOutcome(call_id="c", ok=True, result=42))
    now = iter([5.0, 9.999])

    assert (
        drive_sync(
            _one_attempt(future, []), ends=10.0, clock=lambda: next(now), timed_out=_timed_out
        )
        == 42
    )


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


# -- the asyncio driver's timer: exact at long deadlines too ---------------------------
#
# Linux ends an event loop's wait (epoll_wait) up to 0.1% of its timeout late, and the
# selector rounds the timeout up to a whole millisecond: one loop timer for a 60 s
# deadline fires up to 61 ms late. The driver's expiry wakes early and waits the rest.


@dataclass
class _Timer:
    when: float
    callback: Callable[..., None]
    args: tuple[Any, ...]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class _SlackLoop:
    """An event loop's ``time`` and ``call_at``, on a clock the test moves.

    :meth:`fire_next` runs the next timer as the kernel may: ``slack`` seconds late
    for a wait of the given length.
    """

    def __init__(self, slack: Callable[[float], float]) -> None:
        self.now = 0.0
        self.timers: list[_Timer] = []
        self.waits: list[tuple[float, float]] = []  # (length of the wait, when it ended)
        self._slack = slack

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[..., None], *args: Any) -> _Timer:
        timer = _Timer(when, callback, args)
        self.timers.append(timer)
        return timer

    def live(self) -> list[_Timer]:
        return [t for t in self.timers if not t.cancelled]

    def fire_next(self) -> None:
        timer = min(self.live(), key=lambda t: t.when)
        self.timers.remove(timer)
        wait = max(0.0, timer.when - self.now)
        self.now = timer.when + self._slack(wait)
        self.waits.append((wait, self.now))
        timer.callback(*timer.args)


def _kernel_worst(wait: float) -> float:
    """Later than Linux lets a wait of ``wait`` seconds end (0.1%; up to 0.3% was seen on
    virtual machines): 0.5%, and the selector's millisecond."""
    return wait * 0.005 + SELECT_RESOLUTION


@pytest.mark.parametrize("deadline", [0.05, 0.75, 1.0, 5.0, 60.0, 600.0, 3600.0])
@pytest.mark.parametrize("slack", [_kernel_worst, lambda wait: 0.0], ids=["kernel-worst", "none"])
def test_an_async_deadline_fires_at_its_deadline_after_waking_early_however_late_the_waits_end(
    deadline: float, slack: Callable[[float], float]
) -> None:
    loop = _SlackLoop(slack)
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    _Expiry(cast(asyncio.AbstractEventLoop, loop), deadline, future)
    while not future.done():
        assert len(loop.live()) == 1  # one timer at a time
        loop.fire_next()

    *early, (last_wait, ended) = loop.waits
    assert all(at < deadline for _, at in early), loop.waits  # no stage ended past it
    assert len(loop.waits) <= 4, loop.waits
    # The last wait is short, so its slack is small: never a share of the whole deadline.
    assert last_wait <= ONE_TIMER_WITHIN
    assert ended - deadline <= slack(ONE_TIMER_WITHIN) + 1e-9
    with pytest.raises(Exception) as raised:
        future.result(0)
    assert type(raised.value).__name__ == "_DeadlinePassed"


def test_cancelling_an_async_expiry_after_it_woke_early_cancels_the_timer_it_set_again() -> None:
    loop = _SlackLoop(_kernel_worst)
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    expiry = _Expiry(cast(asyncio.AbstractEventLoop, loop), 60.0, future)
    loop.fire_next()  # the early wake-up sets the next timer
    assert len(loop.live()) == 1

    expiry.cancel()

    assert loop.live() == []
    assert not future.done()


#: How late a real loop's deadline may end: the lateness goal (docs/benchmarks.md, scenario 4).
_REAL_LOOP_BOUND = 0.005


def test_a_long_async_deadline_ends_within_a_few_milliseconds_on_a_real_loop() -> None:
    # One loop timer of 3 s ends 3 to 8 ms late (the kernel's slack, more on a virtual
    # machine); the driver's last timer is short, so it ends within the deadline goal
    # (5 ms; what a virtual machine takes to wake from a long idle). Best of three, for a
    # busy machine.
    def attempt() -> float:
        async def wait() -> float:
            loop = asyncio.get_running_loop()
            future: asyncio.Future[Any] = loop.create_future()
            ends = loop.time() + 3.0
            with pytest.raises(ToolTimeoutError):
                await drive_async(_one_attempt(future, []), ends=ends, timed_out=_timed_out)
            return loop.time() - ends

        return asyncio.run(wait())

    late = []
    for _ in range(3):
        late.append(attempt())
        assert late[-1] >= 0.0  # never before the deadline
        if late[-1] < _REAL_LOOP_BOUND:
            break
    assert min(late) < _REAL_LOOP_BOUND, late


# -- the held call's drive: the same attempts loop, advanced by callbacks ---------------


def _attempts_until_not_expired(futures: list[Waiter], seen: list[str]) -> Attempts:
    """An attempts loop as the client's: another attempt while the outcome says EXPIRED."""
    try:
        for future in futures:
            outcome = yield future
            seen.append(f"answered {outcome.call_id}")
            if outcome.ok:
                return outcome.result
        raise AssertionError("no attempt left")
    except ToolTimeoutError:
        seen.append("timed out")
        raise
    finally:
        seen.append("cleaned up")


def _ok(call_id: str, result: Any = None) -> CallOutcome:
    return CallOutcome(call_id=call_id, ok=True, result=result)


def _expired(call_id: str) -> CallOutcome:
    return CallOutcome.model_validate(
        {
            "call_id": call_id,
            "ok": False,
            "error": {"kind": "expired", "type": "DeadlineExpired", "message": "m"},
        }
    )


class _Ends:
    """What a held drive handed over, and when (on which thread)."""

    def __init__(self) -> None:
        self.ends: list[tuple[Any, BaseException | None]] = []
        self.done = threading.Event()

    def __call__(self, value: Any, error: BaseException | None) -> None:
        self.ends.append((value, error))
        self.done.set()


def _held(attempts: Attempts, ended: _Ends, *, ends: float | None = None) -> HeldDrive:
    return HeldDrive(attempts, ends=ends, clock=time.monotonic, timed_out=_timed_out, ended=ended)


def _started_with_one_attempt(
    ends: float | None = None,
) -> tuple[concurrent.futures.Future[Any], list[str], _Ends, HeldDrive]:
    """A held call started on one attempt: that attempt's future, what the loop saw, what
    the drive handed over, and the drive."""
    first: concurrent.futures.Future[Any] = concurrent.futures.Future()
    seen: list[str] = []
    ended = _Ends()
    drive = _held(_attempts_until_not_expired([first], seen), ended, ends=ends)
    drive.start()
    return first, seen, ended, drive


def test_a_held_call_takes_its_outcome_where_it_arrives_and_hands_its_result_over_once() -> None:
    first, seen, ended, drive = _started_with_one_attempt()
    assert seen == []  # nothing is decided before the outcome arrives

    arrive = threading.Thread(target=first.set_result, args=(_ok("c1", 42),))
    arrive.start()
    arrive.join()

    assert ended.done.wait(5)
    assert ended.ends == [(42, None)]
    assert seen == ["answered c1", "cleaned up"]
    drive.expire()  # the deadline's timer, after the end: changes nothing
    assert ended.ends == [(42, None)]


def test_a_held_call_attempts_again_when_an_answer_calls_for_it_even_one_already_there() -> None:
    # The second attempt's future is settled before the drive waits on it (an outcome
    # this process had stored): its callback runs at once, on the same thread, and the
    # drive must not wait for the lock it holds.
    first: concurrent.futures.Future[Any] = concurrent.futures.Future()
    second: concurrent.futures.Future[Any] = concurrent.futures.Future()
    second.set_result(_ok("c2", "stored"))
    seen: list[str] = []
    ended = _Ends()
    _held(_attempts_until_not_expired([first, second], seen), ended).start()

    first.set_result(_expired("c1"))

    assert ended.done.wait(5)
    assert ended.ends == [("stored", None)]
    assert seen == ["answered c1", "answered c2", "cleaned up"]


def test_a_held_call_whose_deadline_passes_ends_in_the_timeout_and_drops_a_late_outcome() -> None:
    first, seen, ended, drive = _started_with_one_attempt()

    drive.expire()
    first.set_result(_ok("c1", 42))  # the outcome, too late

    assert len(ended.ends) == 1
    value, error = ended.ends[0]
    assert value is None and isinstance(error, ToolTimeoutError)
    assert seen == ["timed out", "cleaned up"]


def test_a_held_call_whose_outcome_arrives_once_its_deadline_passed_ends_in_the_timeout() -> None:
    first, seen, ended, _ = _started_with_one_attempt(ends=time.monotonic())

    first.set_result(_ok("c1", 42))

    assert len(ended.ends) == 1
    assert isinstance(ended.ends[0][1], ToolTimeoutError)
    assert seen == ["timed out", "cleaned up"]


def test_a_held_call_refused_before_any_io_raises_where_it_is_started() -> None:
    def refused() -> Attempts:
        raise ValueError("bad arguments")
        yield  # a generator: never reached

    ended = _Ends()
    with pytest.raises(ValueError, match="bad arguments"):
        _held(refused(), ended).start()
    assert ended.ends == []


def test_a_held_call_given_up_runs_its_cleanup_and_hands_nothing_over() -> None:
    first, seen, ended, drive = _started_with_one_attempt()

    drive.close()
    first.set_result(_ok("c1", 42))
    drive.expire()

    assert ended.ends == []
    assert seen == ["cleaned up"]
