"""Measure the clock client and workers share (Redis' ``TIME``) on the client's I/O loop.

Deadlines travel on Redis' clock (:mod:`wire.clock`); each process measures its offset
to it. The client measures with the asyncio client of its I/O thread
(:mod:`agent_client._io.loop`), on a connection of its own, each ``TIME`` round trip bounded
by :data:`ROUND_TRIP_TIMEOUT`: a frozen or slow Redis never stalls the loop, which
serves every other call's sends, replies and deadlines meanwhile. A measurement is
tried at most once per :data:`RETRY_AFTER` seconds, whatever came of the last one, and
only while the offset is unknown or older than :data:`wire.clock.REFRESH_INTERVAL`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from agent_client._io.link import NotSent, Refused, Unknown
from agent_client._io.loop import IOThread
from wire.clock import Sample, SharedClock, server_seconds
from wire.redis_errors import explain

__all__ = ["RETRY_AFTER", "ROUND_TRIP_TIMEOUT", "ClockMeter"]

logger = logging.getLogger(__name__)

#: Seconds one ``TIME`` round trip may take (connecting included, for the first).
ROUND_TRIP_TIMEOUT = 0.25
#: Seconds between two attempts to measure, whether the last one worked or failed.
RETRY_AFTER = 5.0


class ClockMeter:
    """Measures ``clock``'s offset to the Redis at ``url`` on the I/O thread's loop.

    Args:
        io: The client's I/O thread.
        url: The Redis whose ``TIME`` client and workers share.
        clock: The process's shared clock (:data:`wire.clock.shared_clock`).
    """

    def __init__(self, io: IOThread, url: str, clock: SharedClock) -> None:
        self._io = io
        self._url = url
        self._clock = clock
        self._tried_at = -math.inf
        self._task: asyncio.Task[None] | None = None

    def kick(self) -> asyncio.Task[None] | None:
        """Start a measurement if one is due (call on the loop); the one under way, if any.

        Due: the offset is unknown or old, and the last attempt began at least
        :data:`RETRY_AFTER` seconds ago.
        """
        task = self._task
        if task is not None and not task.done():
            return task
        now = time.monotonic()
        if not self._clock.is_stale() or now - self._tried_at < RETRY_AFTER:
            return None
        self._tried_at = now
        task = self._task = asyncio.get_running_loop().create_task(self._measure())
        return task

    async def _measure(self) -> None:
        link = self._io.link(self._url, "clock")
        samples: list[Sample] = []
        try:
            for _ in range(self._clock.samples):
                sent = self._clock.local()
                (answer,) = await link.execute([("TIME",)], timeout=ROUND_TRIP_TIMEOUT)
                received = self._clock.local()
                if isinstance(answer, Refused | Unknown):
                    raise NotSent(explain(answer.error))
                samples.append(Sample(sent=sent, received=received, server=server_seconds(answer)))
        except (NotSent, ValueError) as exc:
            # The old offset stays (or the local clock, until a first one): never raises.
            logger.debug("could not measure the offset to Redis TIME: %s", exc)
            return
        self._clock.publish(samples)
