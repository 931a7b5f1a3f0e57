"""Whether Redis has been keeping this client's writes: the evidence a death needs.

A worker's heartbeat key lapses whenever Redis cannot take its writes (a pause longer
than an interval, a full memory) and vanishes with a restart, so a missing heartbeat or
record proves a death only if Redis took and kept writes all along while it stayed
missing. The client's own liveness key (:func:`wire.keys.caller`, written three times an
interval by :mod:`agent_client.client`) is the witness. :class:`Writes` notes each write
of it, and each read that looked for it beside what it read: a write refused, a write
answered late, or the key found missing though written within its life (Redis restarted
without it, or let it lapse in a stall) is trouble. :meth:`Writes.steady_since` says
whether there was none since a moment. The watchdog and the catalog ask it before they
take a worker for dead (:mod:`agent_client._io.watchdog`, :mod:`agent_client.catalog`),
and their reads look for the key too, so a read just after a restart is never evidence,
whether or not a write has seen the restart yet. The workers' judgement of a caller rests
on the same rule (:mod:`executor.callers`).

Everything here runs on the client's I/O thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["STALL", "Writes"]

#: Writes taken further apart than this share of an interval: Redis stalled between them.
STALL = 0.9


class Writes:
    """The record of this client's liveness writes: when Redis last refused, delayed or lost one.

    Args:
        key: The client's liveness key, which its reads look for (``EXISTS``).
        interval: The heartbeat interval, which is also the key's life. A write is due
            every third of one; two taken more than :data:`STALL` of an interval apart
            mean Redis stalled between them long enough for a heartbeat to lapse (a key
            lives an interval and is written every third of one: a shorter stall lets
            one lapse only for a moment as Redis comes back, which no two looks an
            interval apart both see), or this client's loop did, which only delays a
            verdict. A tighter bound would take a busy machine's late writes for
            outages and delay every verdict.
        clock: The clock of every moment here (``time.monotonic``).
    """

    def __init__(
        self, key: str, interval: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.key = key
        self._gap = interval * STALL
        self._clock = clock
        self._taken_at: float | None = None
        #: The latest trouble (on ``clock``): no evidence from before it counts.
        self._trouble_at = clock()

    def taken(self, *, kept: bool = True) -> None:
        """A write Redis took (its reply just came); ``kept``: whether the key it replaced
        was still there (``SET ... GET`` answered its old value)."""
        now = self._clock()
        if self._taken_at is None or now - self._taken_at > self._gap:
            self._trouble_at = now  # stalled since the last one: nothing proven in between
        elif not kept:
            self._trouble_at = now  # lost though written within its life: a restart
        self._taken_at = now

    def refused(self) -> None:
        """A write Redis refused (out of memory), lost the answer to, or could not be sent."""
        self._trouble_at = self._clock()

    def seen(self, *, exists: bool) -> None:
        """A read just found the key (``exists``) or not; missing though written within its
        life, Redis lost it (a restart) or let it lapse (a stall): trouble."""
        now = self._clock()
        if not exists and self._taken_at is not None and now - self._taken_at <= self._gap:
            self._trouble_at = now

    def steady_since(self, moment: float) -> bool:
        """Whether Redis has taken and kept every write since ``moment`` (on ``clock``),
        none late, and the latest is recent (none is stuck now)."""
        if self._taken_at is None or self._trouble_at > moment:
            return False
        return self._clock() - self._taken_at <= self._gap
