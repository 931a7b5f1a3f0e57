"""The call a running tool is in: ``current_call()``, and ``report_progress()`` to its caller.

**The call context.** While a worker runs a tool, :func:`current_call` returns the
:class:`CallContext` of the call it runs.

**Progress.** A tool calls :func:`report_progress` as often as it likes; the caller
receives at most one report per :data:`MIN_INTERVAL` (100 ms) per call, always the
latest, and the last one before the outcome. A report only records the latest values
and wakes this process's progress thread, which pushes each due report as a progress
frame (:func:`wire.formats.progress_frame`) onto the caller's reply list, many calls in
one pipeline: the tool's thread, or its event loop, never waits for Redis. When the call
ends, the task body closes its channel (:func:`close_progress`) before it delivers the
outcome: a report still held back is pushed then, and nothing after it, so no progress
reaches the caller after the outcome. A tool thread abandoned at its hard limit reports
into nothing.

Only the call's own caller is told; callers that joined an idempotent call get its
outcome but not its progress. A report that cannot be pushed (Redis unreachable) is
logged at DEBUG and dropped: progress never fails a call.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import redis

from executor import runlog
from executor.worker import redis_client
from wire import keys
from wire.clock import shared_now
from wire.formats import encode_progress, progress_frame
from wire.models import CallRequest
from wire.settings import Settings

__all__ = [
    # The call context
    "CallContext",
    "current_call",
    # Progress
    "MIN_INTERVAL",
    "close_progress",
    "open_progress",
    "report_progress",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class CallContext:
    """What a tool may know about the call it is running.

    Attributes:
        call_id: Unique id of this dispatch (the Celery task id).
        run_id: The agent run the call belongs to, or None outside a run.
        tool: Registered name of the tool.
        idempotency_key: Set for idempotent tools: pass it downstream (for example as a
            payment API's Idempotency-Key) so a retried call is recognised there too.
        deadline: Epoch seconds at which the caller stops waiting, or None; on the
            clock client and workers share (:func:`wire.clock.shared_now`).
        cancelled: Set when the call is cancelled (:mod:`executor.cancel_state`): a ``def``
            tool may poll it (``current_call().cancelled.is_set()``) and stop early;
            whatever it then returns, the call's outcome is ``cancelled``.
    """

    call_id: str
    run_id: str | None
    tool: str
    idempotency_key: str | None
    deadline: float | None
    cancelled: threading.Event = field(default_factory=threading.Event, compare=False)

    def time_left(self) -> float | None:
        """Seconds until the deadline (never negative), or None when there is none.

        Read on the shared clock (:mod:`wire.clock`): it may exceed the caller's timeout
        by the error of the two offsets, client's and worker's (milliseconds on one host).
        """
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - shared_now())


_current: ContextVar[CallContext] = ContextVar("toolexec_current_call")


def current_call() -> CallContext:
    """The context of the call this tool is running.

    Raises:
        LookupError: Called outside a tool run (for example, a tool function called
            directly in a test).
    """
    try:
        return _current.get()
    except LookupError:
        raise LookupError("current_call() is only available while a worker runs a tool") from None


@contextmanager
def _calling(context: CallContext) -> Iterator[CallContext]:
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)


# -- progress --------------------------------------------------------------------------

#: Seconds between two progress frames of one call, at least.
MIN_INTERVAL = 0.1


def report_progress(done: float, total: float | None = None, message: str | None = None) -> None:
    """Tell the caller how far the running tool has got; cheap enough for a hot loop.

    Call it from inside a tool (``def`` or ``async def``, on any pool). Outside a
    worker's run of a tool (a tool function called directly, in a test) it checks
    its arguments and does nothing.

    Args:
        done: Work done so far, in any unit (items, bytes, percent): a finite number >= 0.
        total: The work there is in all, in the same unit, when known: a finite number > 0.
        message: A short text for people (cut to 1000 characters). It travels to the
            caller only; it is never logged.

    Raises:
        TypeError: ``done`` or ``total`` is not a number, or ``message`` not text.
        ValueError: ``done`` is negative or not finite, or ``total`` not positive and finite.
    """
    _check(done, total, message)
    try:
        call_id = current_call().call_id
    except LookupError:
        return
    channel = _channels.get(call_id)
    if channel is not None:
        channel.report(done, total, message)
    runlog.progress(call_id, done, total)


def _check(done: float, total: float | None, message: str | None) -> None:
    for name, value in (("done", done), ("total", total)):
        if value is None and name == "total":
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"report_progress: {name} must be a number, not {type(value).__name__}")
        if not math.isfinite(value):
            raise ValueError(f"report_progress: {name} must be finite")
    if done < 0:
        raise ValueError("report_progress: done must be >= 0")
    if total is not None and total <= 0:
        raise ValueError("report_progress: total must be > 0")
    if message is not None and not isinstance(message, str):
        raise TypeError(f"report_progress: message must be text, not {type(message).__name__}")


def open_progress(call: CallRequest, settings: Settings) -> None:
    """Let the tool about to run ``call`` report progress (the task body, before it runs)."""
    if call.reply_to:
        channel = _Channel(call.call_id, keys.reply(call.reply_to), settings)
        with _registry_lock:
            _channels[call.call_id] = channel


def close_progress(call: CallRequest) -> None:
    """End ``call``'s progress before its outcome is delivered.

    A held-back report is pushed now, after any push under way; later reports, say
    from a thread abandoned at the hard limit, are dropped.
    """
    with _registry_lock:
        channel = _channels.pop(call.call_id, None)
    if channel is not None:
        channel.close()


class _Channel:
    """One call's progress: the latest report not yet pushed, and when it may be."""

    def __init__(self, call_id: str, reply_key: str, settings: Settings) -> None:
        self.call_id = call_id
        self.reply_key = reply_key
        self.settings = settings
        self.lock = threading.Lock()
        self.pending: str | None = None
        self.last_push = -math.inf
        self.scheduled = False
        self.closed = False
        self.seq = 0

    def report(self, done: float, total: float | None, message: str | None) -> None:
        with self.lock:
            if self.closed:
                return
            self.seq += 1
            self.pending = encode_progress(self.seq, done, total, message)
            if self.scheduled:
                return
            self.scheduled = True
            due = self.last_push + MIN_INTERVAL
        _pusher().schedule(self, due)

    def take(self) -> str | None:
        """The report to push now (the caller holds ``lock``); None if there is none."""
        self.scheduled = False
        if self.closed or self.pending is None:
            return None
        encoded, self.pending = self.pending, None
        self.last_push = time.monotonic()
        return encoded

    def close(self) -> None:
        """Push a held-back report, after any push under way, then take no more."""
        with self.lock:
            encoded = self.take()
            self.closed = True
            if encoded is not None:
                _push(self.settings, [(self.reply_key, progress_frame(self.call_id, encoded))])


def _push(settings: Settings, frames: list[tuple[str, str]]) -> None:
    try:
        pipe = redis_client(settings).pipeline(transaction=False)
        for reply_key, frame in frames:
            pipe.rpush(reply_key, frame)
            pipe.expire(reply_key, settings.reply_ttl)
        pipe.execute()
    except redis.RedisError as exc:
        logger.debug("dropped %d progress reports: %s", len(frames), type(exc).__name__)


class _Pusher:
    """This process's progress thread: pushes each channel's report when it is due."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._due: list[tuple[float, int, _Channel]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="toolexec-progress", daemon=True)
        self._thread.start()

    def schedule(self, channel: _Channel, due: float) -> None:
        with self._wake:
            heapq.heappush(self._due, (due, next(self._order), channel))
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._wake.wait(None if not self._due else self._due[0][0] - time.monotonic())
                now = time.monotonic()
                ready = []
                while self._due and self._due[0][0] <= now:
                    ready.append(heapq.heappop(self._due)[2])
            self._push(ready)

    @staticmethod
    def _push(channels: list[_Channel]) -> None:
        # Each channel's lock is held until its frame is in Redis, so a channel that
        # closes meanwhile pushes its last report after this one, never before.
        by_settings: dict[int, tuple[Settings, list[tuple[str, str]]]] = {}
        held: list[_Channel] = []
        try:
            for channel in channels:
                channel.lock.acquire()
                held.append(channel)
                encoded = channel.take()
                if encoded is None:
                    continue
                entry = by_settings.setdefault(id(channel.settings), (channel.settings, []))
                entry[1].append((channel.reply_key, progress_frame(channel.call_id, encoded)))
            for settings, frames in by_settings.values():
                _push(settings, frames)
        except Exception:  # the thread must live on for other calls
            logger.exception("the progress thread failed to push reports")
        finally:
            for channel in held:
                channel.lock.release()


_registry_lock = threading.Lock()
_channels: dict[str, _Channel] = {}
_pusher_lock = threading.Lock()
_the_pusher: _Pusher | None = None


def _pusher() -> _Pusher:
    global _the_pusher
    pusher = _the_pusher
    if pusher is None or pusher.pid != os.getpid():
        with _pusher_lock:
            if _the_pusher is None or _the_pusher.pid != os.getpid():
                _the_pusher = _Pusher()
            pusher = _the_pusher
    return pusher


def _after_fork_in_child() -> None:
    # A pool child starts with no calls and no thread; locks a parent's thread held
    # at the fork would never be released here.
    global _registry_lock, _pusher_lock, _the_pusher
    _registry_lock, _pusher_lock, _the_pusher = threading.Lock(), threading.Lock(), None
    _channels.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
