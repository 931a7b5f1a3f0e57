"""What the client knows about one call while its caller waits.

A :class:`CallState` is shared by the caller's thread, which gives up at the deadline,
and the client's I/O thread, which sends the call and watches it:

* **sending**: whether a write of the call may have reached Redis (``written``) and
  whether Redis confirmed it (``confirmed``). At the deadline the caller reads both at
  once with :meth:`CallState.abandon`: not written means the call was provably not sent
  (``BrokerUnavailable``), written but not confirmed means its outcome is unknown
  (``ToolOutcomeUnknown``), confirmed means it timed out (``ToolTimeoutError``);
* **watching**: what the watchdog (:mod:`agent_client.watchdog`) needs to notice that
  the call is lost: where its holder is recorded, the message to look for in the queue,
  and what it saw the last time it looked.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from wire.models import Delivery

__all__ = ["CallState"]


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
        since: When the send was confirmed (``time.monotonic()``), or re-sent.
        absent_since: When the watchdog first found the call neither queued nor held.
        resent: How many times the watchdog sent it again.
        resend: Sends the call again through the publisher (set by the client).
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
    since: float = 0.0
    absent_since: float | None = None
    resent: int = 0
    resend: Callable[[], None] | None = None
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

    def abandon(self) -> tuple[bool, bool, str]:
        """Stop sending (caller); ``(confirmed, written, last error)`` as of this moment."""
        with self._lock:
            self.abandoned = True
            return self.confirmed, self.written, self.last_error
