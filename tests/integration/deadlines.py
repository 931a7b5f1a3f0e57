"""What a tool's ``current_call().time_left()`` may read for a caller's timeout.

Client and worker each measure their own offset to Redis' ``TIME``, each to within half
its fastest round trip (:mod:`wire.clock`), so the worker's now and the client's differ
by up to the sum of the two errors: a few milliseconds on one machine under load. The
worker's reading then lies between the timeout less the time the call took to start
(under a second here) and the timeout plus that error.
"""

from __future__ import annotations

__all__ = ["CLOCK_ERROR", "as_set"]

#: Seconds a worker's time_left may read over the caller's timeout: the two offsets'
#: measurement errors together, with room for a loaded machine's slow round trips.
CLOCK_ERROR = 0.05


def as_set(time_left: float, timeout: float) -> bool:
    """Whether ``time_left``, read by a tool as it started, is what a caller's ``timeout``
    set: within a second of it, and never over it by more than :data:`CLOCK_ERROR`."""
    return timeout - 1.0 < time_left <= timeout + CLOCK_ERROR
