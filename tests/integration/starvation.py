"""How long a test's own process went without the CPU, so a load test can tell a late
caller it made from one the machine made.

A caller hears its deadline from a timer on its own event loop: when the machine runs
many more threads than it has cores (the suite runs six tests at once on two cores, each
with its Redis servers and workers), the operating system can leave the whole process
off the CPU for a second, and every timer of that second fires late, whatever the client
does. :class:`LoopWatch` ticks on the test's loop and records each tick that came late by
more than :data:`LEAST_STALL`, with the CPU the process used meanwhile (all its threads:
the caller's and the client's I/O thread). A stall in which the process used less than
:data:`STARVED_SHARE` of one core is the machine's: the process was runnable and not run.
A stall in which it used more is the process's own work, and excuses nothing.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

__all__ = ["LEAST_STALL", "STARVED_SHARE", "LoopWatch", "Stall"]

#: A tick later than this is recorded as a stall.
LEAST_STALL = 0.1
#: A stall in which the process used less CPU than this share of one core was starved.
STARVED_SHARE = 0.5


@dataclass(frozen=True)
class Stall:
    """A stretch in which the loop took no turn: from ``begin`` to ``end`` (seconds on
    the watch's clock), and the CPU seconds the process used meanwhile."""

    begin: float
    end: float
    cpu: float

    @property
    def starved(self) -> bool:
        """Whether the process was kept off the CPU (rather than busy) in this stall."""
        return self.cpu < STARVED_SHARE * (self.end - self.begin)


class LoopWatch:
    """Records the stalls of the running loop from :meth:`run` until it is cancelled.

    Args:
        origin: The ``time.monotonic()`` that is 0 on this watch's clock (the test's
            start), so stalls compare with the test's own times.
        tick: How often the watch wakes.
    """

    def __init__(self, origin: float, *, tick: float = 0.02) -> None:
        self._origin = origin
        self._tick = tick
        self.stalls: list[Stall] = []

    async def run(self) -> None:
        """Tick until cancelled, recording each late tick."""
        while True:
            began, cpu = time.monotonic(), time.process_time()
            await asyncio.sleep(self._tick)
            now = time.monotonic()
            if now - began - self._tick > LEAST_STALL:
                self.stalls.append(
                    Stall(began - self._origin, now - self._origin, time.process_time() - cpu)
                )

    def starved_within(self, begin: float, end: float) -> float:
        """Seconds between ``begin`` and ``end`` that the process spent starved."""
        return sum(
            max(0.0, min(end, s.end) - max(begin, s.begin)) for s in self.stalls if s.starved
        )

    def summary(self) -> str:
        """The stalls in a sentence, for a test's report."""
        starved = [s for s in self.stalls if s.starved]
        if not self.stalls:
            return "the test's loop never stalled"
        longest = max(self.stalls, key=lambda s: s.end - s.begin)
        return (
            f"the test's loop stalled {len(self.stalls)} times ({len(starved)} starved of CPU, "
            f"{sum(s.end - s.begin for s in starved):.2f} s in all); the longest "
            f"{longest.end - longest.begin:.2f} s at {longest.begin:.2f} s, the process using "
            f"{longest.cpu:.2f} s of CPU in it"
        )
