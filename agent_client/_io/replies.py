"""One reply listener per ToolClient: resolves every waiting call from the client's reply list.

Workers push reply frames (:func:`wire.formats.reply_frame`) onto the client's reply
list. The listener runs on the client's I/O thread (:mod:`agent_client._io.loop`) and reads
the list without losing a frame to a broken connection, one round trip per wake-up:
``BLMOVE`` of the list's head onto itself, back to the head (it changes nothing; it
only waits until the list holds a frame), then, in the same pipeline, ``LRANGE``, which
Redis runs once the wait ends and which reads what is there, in order. Nothing is
removed by reading: only after the frames arrived here does the next pipeline's
``LTRIM`` drop exactly those (workers only append meanwhile); a read that follows a
pause for replies to gather (below) skips the wait. A frame read twice
(after a connection broke before its ``LTRIM`` was answered) is harmless: an outcome
finds nobody waiting and is dropped unparsed, as is a reply whose caller timed out,
and a progress report already handed on is skipped by its sequence number. Under load
(many calls waiting, replies coming fast) the listener pauses a few milliseconds
between reads so that one wake-up reads many replies (:class:`_Gather`).

When Redis goes away the listener keeps trying, with backoff, and re-attaches to the
same list when it is back: waiting calls keep waiting, and only their deadlines end
their wait.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

import pydantic

from agent_client._io.callstate import CallState
from agent_client._io.link import NotSent, Refused, Unknown, backoff_after
from agent_client._io.loop import IOThread, Waiter, settle_from_thread
from wire.formats import parse_frame
from wire.models import CallOutcome, ErrorKind

logger = logging.getLogger(__name__)

#: Frames read per ``LRANGE``.
_DRAIN_BATCH = 512
#: Seconds the listener waits on a read beyond its blocking time before it counts the
#: connection as stalled and makes another (a frozen Redis, a dead host).
_STALL_GRACE = 10.0
#: Under load, the listener lets replies gather between reads for this long per waiting
#: call, at most :data:`_GATHER_MAX` seconds; a pause below :data:`_GATHER_MIN` is skipped.
_GATHER_PER_CALL = 50e-6
_GATHER_MAX = 0.005
_GATHER_MIN = 0.001
#: ... and only when replies come fast enough that this many would gather meanwhile.
_GATHER_FRAMES = 1.0


class ProgressReceiver(Protocol):
    """Where a call's progress frames go (:class:`agent_client.progress.ProgressSink`)."""

    def deliver(self, body: bytes, call_id: str) -> None:
        """Take the body of a progress frame of ``call_id`` (on the I/O thread); never raises."""


@dataclass(eq=False, slots=True)
class Waiting:
    """A call someone waits for: its future, if watched its state, and where its progress goes."""

    future: Waiter
    state: CallState | None
    progress: ProgressReceiver | None = None


class ReplyRouter:
    """Resolves call futures from one Redis reply list.

    Args:
        io: The client's I/O thread, which runs :meth:`listen`.
        url: The Redis that holds the reply list.
        reply_key: The reply list.
        block: Seconds one ``BLMOVE`` waits.
    """

    def __init__(self, io: IOThread, url: str, reply_key: str, *, block: float) -> None:
        self._io = io
        self._url = url
        self._key = reply_key
        self._block = block
        self._pending: dict[str, Waiting] = {}
        self._lock = threading.Lock()

    def expect(
        self,
        call_id: str,
        state: CallState | None = None,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        progress: ProgressReceiver | None = None,
    ) -> Waiter:
        """Register interest in ``call_id``'s outcome; start the listener if needed.

        Returns a future of ``loop`` (call from that loop's thread) or, without a
        loop, a ``concurrent.futures.Future``. The call's progress frames, until its
        outcome, go to ``progress``; without one they are dropped.
        """
        future: Waiter = loop.create_future() if loop is not None else Future()
        with self._lock:
            self._pending[call_id] = Waiting(future, state, progress)
        if not self._io.running:
            self._io.loop  # noqa: B018 - starts the thread, and with it the listener
        return future

    def forget(self, call_id: str) -> None:
        """Stop waiting for ``call_id``; its outcome, if it comes, is dropped."""
        with self._lock:
            waiting = self._pending.pop(call_id, None)
        if waiting is not None and waiting.state is not None:
            waiting.state.abandon()

    @property
    def pending(self) -> int:
        """How many calls are waiting."""
        return len(self._pending)

    def watched(self, *, waited: float) -> list[tuple[str, CallState]]:
        """The calls whose send was confirmed at least ``waited`` seconds ago."""
        now = time.monotonic()
        with self._lock:
            return [
                (call_id, w.state)
                for call_id, w in self._pending.items()
                if w.state is not None and w.state.confirmed and now - w.state.since >= waited
            ]

    def settle(self, call_id: str, outcome: CallOutcome) -> bool:
        """Resolve ``call_id`` with ``outcome`` from this thread; False if nobody waits."""
        with self._lock:
            waiting = self._pending.pop(call_id, None)
        if waiting is None:
            return False
        settle_from_thread([(waiting.future, outcome, None)])
        return True

    # -- the listener, on the I/O thread -------------------------------------------------

    async def listen(self) -> None:
        """Read the reply list until cancelled, re-attaching after every outage."""
        link = self._io.link(self._url, "replies")
        trim = 0  # frames the last LRANGE read, to drop before the next wait
        failing_since: float | None = None
        backoff = 0.0  # the last pause while Redis could not be reached (link.backoff_after)
        gather = _Gather()
        gathered = False  # the last read was followed by a pause for replies to gather
        while True:
            commands: list[tuple[Any, ...]] = [("LTRIM", self._key, trim, -1)] if trim else []
            # After a full batch more is waiting, and after a pause for replies to gather
            # some have: read on at once. Otherwise wait for the first frame, moving the
            # head onto the head (which moves nothing).
            if trim < _DRAIN_BATCH and not gathered:
                commands.append(("BLMOVE", self._key, self._key, "LEFT", "LEFT", self._block))
            commands.append(("LRANGE", self._key, 0, _DRAIN_BATCH - 1))
            try:
                replies = await link.execute(commands, timeout=self._block + _STALL_GRACE)
                failed = next((r for r in replies if isinstance(r, Unknown | Refused)), None)
                trim = 0  # trimmed, or unknown: read again from the head either way
                if failed is None:
                    frames = replies[-1]
                    self._resolve(frames)
                    trim = len(frames)
            except NotSent as exc:
                failed = Unknown(exc)
            if failed is None:
                if failing_since is not None:
                    logger.info("reconnected to Redis; waiting calls re-attached to their replies")
                failing_since, backoff = None, 0.0
                gathered = False
                if trim and (pause := gather.pause(trim, len(self._pending))):
                    await asyncio.sleep(pause)
                    gathered = True
                continue
            if failing_since is None:
                failing_since = time.monotonic()
                logger.warning(
                    "lost the connection to Redis while waiting for replies (%s); waiting calls "
                    "keep waiting until their deadlines",
                    type(getattr(failed, "error", failed)).__name__,
                )
            backoff = backoff_after(backoff)
            await asyncio.sleep(backoff)

    def _resolve(self, frames: list[Any]) -> None:
        settled: list[tuple[Waiter, Any, BaseException | None]] = []
        for frame in frames:
            if not isinstance(frame, bytes):
                continue
            call_id, is_progress, body = parse_frame(frame)
            if is_progress:  # handed on in order, before the outcome that follows it
                with self._lock:
                    sink = getattr(self._pending.get(call_id), "progress", None)
                if sink is not None:
                    sink.deliver(body, call_id)
                continue
            with self._lock:
                waiting = self._pending.pop(call_id, None)
            if waiting is None:
                continue  # abandoned by its caller, or read before: dropped without parsing
            try:
                outcome = CallOutcome.model_validate_json(body)
            except pydantic.ValidationError as exc:
                outcome = CallOutcome.failure(
                    call_id,
                    ErrorKind.EXECUTION,
                    "MalformedReply",
                    f"the worker's reply did not parse: {exc}",
                )
            settled.append((waiting.future, outcome, None))
        settle_from_thread(settled)


class _Gather:
    """How long the listener lets replies gather before its next read, under load.

    Every wake-up of the listener costs the same whatever it reads: a round trip, a hop
    to each waiting caller's loop, and there a batch of new sends. With many calls in
    flight, replies come one or two per wake-up unless the listener waits a moment
    between reads, and the client then spends most of its CPU on wake-ups. So while
    many calls wait (50 µs per waiting call, at most 5 ms: a small share of the wait
    of a call among that many in flight) and replies come fast enough that another
    would gather meanwhile, the listener pauses before reading again. With few calls in
    flight, or replies that come seldom, it reads again at once. Nothing waits on the
    pause but the reading of frames already in Redis: callers' deadlines are their own
    timers, and a frame stays in the list, unread, until a read takes it.
    """

    def __init__(self) -> None:
        self._last = time.monotonic()
        self._rate = 0.0  # replies per second, smoothed over the last wake-ups

    def pause(self, frames: int, waiting: int) -> float:
        """Seconds to pause after a read of ``frames`` frames with ``waiting`` calls left."""
        now = time.monotonic()
        elapsed, self._last = now - self._last, now
        if elapsed > 0:
            self._rate += 0.3 * (frames / elapsed - self._rate)
        pause = min(_GATHER_MAX, waiting * _GATHER_PER_CALL)
        if pause < _GATHER_MIN or self._rate * pause < _GATHER_FRAMES:
            return 0.0
        return pause
