"""One call on its way: what is sent, and what the client knows of it while its caller waits.

A :class:`Send` is what the caller hands the client's I/O thread: the prepared call (an
:class:`Outgoing`), the future its outcome resolves, the caller's deadline, and its
:class:`CallState`. Every lane (:mod:`agent_client._io.send`) takes Sends, whichever
broker it writes to.

A :class:`CallState` is shared by the caller's thread, which gives up at the deadline,
and the client's I/O thread, which sends the call and watches it:

* **sending**: whether a write of the call may have reached Redis (``written``) and
  whether Redis confirmed it (``confirmed``). At the deadline the caller reads both at
  once with :meth:`CallState.abandon`: confirmed means it timed out
  (``ToolTimeoutError``); otherwise, if a send failed or Redis has kept the client's
  sends waiting (``SEND_STALL``), not written means the call was
  provably not sent (``BrokerUnavailable``) and written means its outcome is unknown
  (``ToolOutcomeUnknown``); with Redis answering, it timed out too;
* **watching**: what the watchdog (:mod:`agent_client._io.watchdog`) needs to notice that
  the call is lost: where its holder is recorded, the message to look for in the queue,
  and what it saw the last time it looked.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from agent_client._io.loop import Waiter
from wire.models import CallRequest, Delivery, ToolSpec

#: Seconds one operation may take at most (a pipeline, a connect) before its fate
#: counts as unknown and it is sent again.
OP_TIMEOUT = 2.0
#: How long Redis may keep a send waiting before a deadline that passes meanwhile is
#: put down to Redis (``BrokerUnavailable``, ``ToolOutcomeUnknown``) rather than to the
#: deadline: a healthy server answers a batch in milliseconds. An operation whose
#: timeout, cut short by its callers' deadlines, ends sooner than this tells nothing of
#: the server, and is not counted as a failed send.
SEND_STALL = 0.1


@dataclass(kw_only=True, eq=False)
class CallState:
    """One waiting call: how far its send got, and what the watchdog saw of it.

    Attributes:
        tool: The tool's name.
        delivery: The tool's delivery mode.
        queue: The queue's list.
        envelope: The message as pushed onto the queue.
        running_keys: Where workers record who holds the call, most telling first.
        idempotency_key: The key of an idempotent call, else None.
        written: A write of the call may have reached Redis.
        confirmed: Redis answered the send: the call is queued, claimed or joined.
        abandoned: The caller stopped waiting; nothing more is sent for it.
        last_error: Why the last attempt to send failed, for the caller's error.
        joined: The send joined an execution another call claimed (no message of its own).
        stored: The claim found the key's outcome stored: the call is answered from it.
        since: When the send was confirmed (``time.monotonic()``), or re-sent.
        absent_since: When the watchdog first found the call neither queued nor held.
        absent_epoch: The same moment on the shared clock (``wire.clock``).
        resent: How many times the watchdog sent it again (the generation of the
            latest copy: ``wire.copies``).
        resend: Sends the call again through the publisher (set by the client).
        fence_ttl_ms: How long the call's fence lives (``wire.keys.fence``).
        pushed: The text of the latest copy pushed: the envelope, then each copy sent again.
        seen_holder: The call's holder record as the watchdog last read it (stale or not).
        queued: Resolved once the send was first confirmed (``RemoteTool.submit`` waits for it).
        run: The run the call is logged under (``wire.runlog.run_of``); empty when the
            client logs nothing.
    """

    tool: str
    delivery: Delivery
    queue: str
    envelope: str
    running_keys: tuple[str, ...]
    idempotency_key: str | None = None
    written: bool = False
    confirmed: bool = False
    abandoned: bool = False
    last_error: str = ""
    joined: bool = False
    stored: bool = False
    since: float = 0.0
    absent_since: float | None = None
    absent_epoch: float = 0.0
    resent: int = 0
    resend: Callable[[], None] | None = None
    fence_ttl_ms: int = 1000
    pushed: str = ""
    seen_holder: bytes | None = None
    run: str = ""
    #: Resolved once Redis (or RabbitMQ) first confirmed the send: the call is queued,
    #: claimed or joined, and a submitted call's record written before it.
    queued: concurrent.futures.Future[None] = field(
        default_factory=concurrent.futures.Future, repr=False
    )
    _written_before: bool = field(default=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def take(self) -> bool:
        """Claim the call for a write (I/O thread); False if its caller gave up."""
        with self._lock:
            if self.abandoned:
                return False
            self._written_before, self.written = self.written, True
            return True

    def untake(self) -> None:
        """Nothing of the write taken last went out (no connection, I/O thread)."""
        with self._lock:
            self.written = self._written_before

    def confirm(self, *, joined: bool = False) -> None:
        """Redis answered the send (I/O thread)."""
        self.joined = joined
        self.since = time.monotonic()
        self.absent_since = None
        self.confirmed = True
        if not self.queued.done():
            self.queued.set_result(None)

    def abandon(self) -> tuple[bool, bool, str]:
        """Stop sending (caller); ``(confirmed, written, last error)`` as of this moment."""
        with self._lock:
            self.abandoned = True
            return self.confirmed, self.written, self.last_error


class Outgoing(Protocol):
    """What the I/O thread reads of a prepared call (:class:`agent_client.prepare.PreparedCall`):
    its tool, the request (its id, its key), the message, and the TTLs of its keys."""

    @property
    def spec(self) -> ToolSpec: ...
    @property
    def request(self) -> CallRequest: ...
    @property
    def envelope(self) -> str: ...
    @property
    def claim_ttl_ms(self) -> int | None: ...
    @property
    def sent_ttl_ms(self) -> int: ...


@dataclass(kw_only=True, slots=True, eq=False)
class Send:
    """One call to send, the future its outcome resolves, and its state.

    Attributes:
        call: The prepared call.
        future: Resolved by the outcome (or an error).
        state: How far the send got; shared with the caller and the watchdog.
        expires_at: The caller's deadline (``time.monotonic()``), or None.
        push_only: Push the message even though the call is idempotent (its claim,
            on a Redis apart from the broker, is already made).
        record: A submitted call's record (``wire.handles``), written before the message
            is sent: field -> value. None for a plain call.
        logged: Whether the run log has the call as sent (:mod:`agent_client._io.runlog`).
        made_at: When its caller made the call, in ms on the shared clock (the run log's
            time it was sent).
    """

    call: Outgoing
    future: Waiter
    state: CallState
    expires_at: float | None = None
    push_only: bool = False
    record: dict[str, str] | None = None
    record_ttl_ms: int = 0
    logged: bool = False
    made_at: int | None = None


def op_timeout(items: Iterable[Send]) -> float:
    """How long one operation for ``items`` may take: bounded by the time their callers
    have left (past that, nobody waits for the answer), at most :data:`OP_TIMEOUT`."""
    now = time.monotonic()
    left = max(
        ((OP_TIMEOUT if i.expires_at is None else i.expires_at - now) for i in items),
        default=OP_TIMEOUT,
    )
    return min(OP_TIMEOUT, max(0.05, left))


def note(items: Iterable[Send], why: str) -> None:
    """Record ``why`` the last attempt to send ``items`` failed, for their callers' errors."""
    for item in items:
        item.state.last_error = why
