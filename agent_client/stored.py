"""Outcomes of idempotent calls this process has already seen stored.

A stored outcome never changes while it is kept, so a repeat of the call in the same
process is answered from here, with no round trip at all. Bounded (least recently used
first out) and kept no longer than ``TOOLEXEC_OUTCOME_TTL``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from wire.models import CallOutcome

__all__ = ["StoredOutcomes"]


class StoredOutcomes:
    """A bounded, expiring map: idempotency key -> stored outcome."""

    def __init__(self, *, ttl: float, max_entries: int = 10_000) -> None:
        self._ttl = ttl
        self._max = max_entries
        self._entries: OrderedDict[str, tuple[float, CallOutcome]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> CallOutcome | None:
        """The outcome stored under ``key``, if this process saw it and it is still kept."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry[0] <= time.monotonic():
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return entry[1]

    def put(self, key: str, outcome: CallOutcome) -> None:
        """Remember ``outcome`` as stored under ``key``."""
        with self._lock:
            self._entries[key] = (time.monotonic() + self._ttl, outcome)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)

    def after_fork(self) -> None:
        """In a forked child: a fresh lock (another thread of the parent may have held it)."""
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)
