"""The clock client and workers agree on: Redis' ``TIME``.

A call's deadline travels as absolute epoch seconds, and the worker compares it with
its own idea of now. Hosts' clocks drift (containers, paused VMs, NTP steps), so both
sides read time from the one server they both talk to. Each process measures its
offset to Redis' ``TIME`` (``server - local``, the local time taken at the midpoint of
the round trip; the sample with the shortest round trip of a few wins) and refreshes it
every :data:`REFRESH_INTERVAL` seconds on round trips it makes anyway: the client with
its catalog reads, the worker with its heartbeat. :func:`shared_now` is then
``time.time() + offset``, with no I/O. Until a first measurement it is the local clock.

The process-wide offset lives in a few bytes of memory shared across ``fork()``: a
worker's main process measures it with its heartbeat, and its prefork pool children
(forked earlier or later) read it.
"""

from __future__ import annotations

import logging
import math
import mmap
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis

__all__ = [
    "REFRESH_INTERVAL",
    "SAMPLES",
    "OffsetStore",
    "Sample",
    "SharedClock",
    "TimeSource",
    "best_sample",
    "refresh_shared_clock",
    "server_seconds",
    "shared_clock",
    "shared_now",
]

logger = logging.getLogger(__name__)

#: Seconds a measured offset is used before the next refresh measures it again.
REFRESH_INTERVAL = 60.0

#: ``TIME`` round trips per measurement; the one with the shortest round trip wins.
SAMPLES = 3


class TimeSource(Protocol):
    """What the clock needs of a Redis client: ``TIME``."""

    def time(self) -> Any:
        """Redis' ``TIME``: (seconds, microseconds)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One ``TIME`` round trip.

    Attributes:
        sent: Local epoch seconds just before the command was sent.
        received: Local epoch seconds just after the answer arrived.
        server: The server's epoch seconds in the answer.
    """

    sent: float
    received: float
    server: float

    @property
    def round_trip(self) -> float:
        """Seconds the round trip took (local clock)."""
        return self.received - self.sent

    @property
    def offset(self) -> float:
        """Server minus local time, taking the server's reading at the trip's midpoint."""
        return self.server - (self.sent + self.received) / 2


def server_seconds(answer: Any) -> float:
    """Epoch seconds from a ``TIME`` answer: redis-py's ``(seconds, microseconds)``.

    Raises:
        ValueError: The answer is not two integers.
    """
    try:
        seconds, micros = answer
        return int(seconds) + int(micros) / 1_000_000
    except (TypeError, ValueError) as exc:
        raise ValueError(f"not a TIME answer: {answer!r}") from exc


def best_sample(samples: Sequence[Sample]) -> Sample:
    """The sample with the shortest round trip: its midpoint is the tightest estimate.

    Raises:
        ValueError: ``samples`` is empty.
    """
    if not samples:
        raise ValueError("no TIME samples")
    return min(samples, key=lambda s: s.round_trip)


class OffsetStore:
    """The offset and when it was measured, in memory shared with forked children.

    A seqlock over an anonymous shared mapping: a reader retries while a write is under
    way, so it does not see half of one (two processes writing at the same moment may
    mix two fresh measurements, which is harmless). ``measured_at`` is
    ``time.monotonic()``, the same clock in every process of a host.
    """

    _LAYOUT = struct.Struct("<Qdd")  # sequence, offset, measured_at (NaN: never)
    _SEQ = struct.Struct("<Q")
    #: Reads tried before taking what is there (a writer killed mid-write leaves it odd).
    _TRIES = 1000

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, self._LAYOUT.size)  # MAP_SHARED: survives fork
        self._lock = threading.Lock()
        self._LAYOUT.pack_into(self._map, 0, 0, 0.0, float("nan"))

    def read(self) -> tuple[float, float] | None:
        """``(offset, measured_at)``, or None if nothing was measured yet."""
        for _ in range(self._TRIES):
            seq, offset, measured_at = self._LAYOUT.unpack_from(self._map, 0)
            if seq % 2 == 0 and self._SEQ.unpack_from(self._map, 0)[0] == seq:
                break  # no write under way, none finished meanwhile
        if math.isnan(measured_at):  # never measured
            return None
        return offset, measured_at

    def write(self, offset: float, measured_at: float) -> None:
        """Publish a new measurement to this process and its forked relatives."""
        with self._lock:
            # Odd while writing, even after, also when another process writes at once.
            writing = self._SEQ.unpack_from(self._map, 0)[0] | 1
            self._SEQ.pack_into(self._map, 0, writing)
            self._LAYOUT.pack_into(self._map, 0, writing, offset, measured_at)
            self._SEQ.pack_into(self._map, 0, writing + 1)


class SharedClock:
    """Local time corrected by the offset to Redis' ``TIME``.

    Args:
        store: Where the offset lives; a fresh fork-shared store when omitted.
        local: The local clock (epoch seconds).
        monotonic: The clock that times refreshes.
        max_age: Seconds after which :meth:`refresh_if_stale` measures again.
        samples: ``TIME`` round trips per measurement.
    """

    def __init__(
        self,
        store: OffsetStore | None = None,
        *,
        local: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        max_age: float = REFRESH_INTERVAL,
        samples: int = SAMPLES,
    ) -> None:
        self._store = store or OffsetStore()
        self._local = local
        self._monotonic = monotonic
        self._max_age = max_age
        self._samples = max(1, samples)
        self._measuring = threading.Lock()
        self._told_unknown = False

    @property
    def offset(self) -> float | None:
        """Seconds to add to the local clock to read the shared one; None if unmeasured."""
        known = self._store.read()
        return None if known is None else known[0]

    def now(self) -> float:
        """The shared clock's epoch seconds; the local clock until a first measurement."""
        known = self._store.read()
        if known is None:
            if not self._told_unknown:
                self._told_unknown = True
                logger.debug("no offset to Redis TIME measured yet; deadlines use the local clock")
            return self._local()
        return self._local() + known[0]

    def measure(self, client: TimeSource) -> Sample:
        """Measure the offset now with a few ``TIME`` round trips and publish it.

        Raises:
            redis.RedisError: Redis could not be asked.
            ValueError: Redis gave an answer that is not a time.
        """
        samples = []
        for _ in range(self._samples):
            sent = self._local()
            answer = client.time()
            received = self._local()
            samples.append(Sample(sent=sent, received=received, server=server_seconds(answer)))
        return self.publish(samples)

    @property
    def samples(self) -> int:
        """``TIME`` round trips per measurement."""
        return self._samples

    def local(self) -> float:
        """The local clock a sample's ``sent`` and ``received`` are read on."""
        return self._local()

    def publish(self, samples: Sequence[Sample]) -> Sample:
        """Publish the offset of the best of ``samples``, measured by the caller.

        For a caller that makes the ``TIME`` round trips itself (an asyncio client, read
        with :meth:`local` around each). Returns the sample used.

        Raises:
            ValueError: ``samples`` is empty.
        """
        best = best_sample(samples)
        self._store.write(best.offset, self._monotonic())
        logger.debug(
            "offset to Redis TIME: %+.6fs (round trip %.6fs)", best.offset, best.round_trip
        )
        return best

    def is_stale(self) -> bool:
        """Whether the offset is unknown or older than ``max_age``."""
        known = self._store.read()
        return known is None or self._monotonic() - known[1] >= self._max_age

    def refresh_if_stale(self, client: TimeSource) -> bool:
        """Measure again if the offset is unknown or old; never raises.

        Meant to ride on a round trip the caller makes anyway (a catalog read, a
        heartbeat), so a call never waits for it. A failure keeps the old offset.
        Returns whether a new offset was published.
        """
        if not self.is_stale() or not self._measuring.acquire(blocking=False):
            return False  # fresh, or another thread of this process is measuring
        try:
            if not self.is_stale():
                return False
            self.measure(client)
            return True
        except (redis.RedisError, OSError, ValueError) as exc:
            logger.debug("could not measure the offset to Redis TIME: %s", exc)
            return False
        finally:
            self._measuring.release()


#: This process's shared clock (and its forked children's).
shared_clock = SharedClock()


def shared_now() -> float:
    """Epoch seconds on the clock client and workers share (Redis' ``TIME``)."""
    return shared_clock.now()


def refresh_shared_clock(client: TimeSource) -> bool:
    """Refresh this process's offset if it is unknown or old; never raises."""
    return shared_clock.refresh_if_stale(client)
