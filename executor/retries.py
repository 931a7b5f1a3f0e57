"""A tool's retries on the worker: ``@tool(retries=3, retry_on=(ConnectionError,))``.

The policy is checked once, at registration (:func:`retry_policy`: anything wrong is a
:class:`~executor.errors.ToolDefinitionError` naming the tool). While a call runs,
:class:`Attempts` counts its attempts and says whether another may start
(:mod:`executor.runner` runs them). Another attempt starts only when all of these hold:

* the tool itself raised an exception its policy retries (``retry_on``). The runner
  never asks about a hard timeout, an exception other than :class:`Exception` (a cancel's
  ``asyncio.CancelledError``, ``SystemExit``, ``KeyboardInterrupt``) or a call whose
  arguments were invalid (it never ran), and a cancelled call is never retried;
* attempts are left: ``retries`` after the first;
* the pause before it and the attempt itself fit before the call's deadline (on the
  shared clock, :func:`wire.clock.shared_now`): the attempt needs the tool's
  ``hard_timeout``, or, without one, as long as the attempt before it took. Otherwise
  the call ends at once with the last error.

The pause after attempt ``k`` is ``retry_backoff * 2 ** (k - 1)``, capped
(:func:`wire.models.retry_pause_bound`), with "equal jitter": a random point in its upper
half, so that calls that failed together do not come back together.

An at-most-once tool (the default for a tool that is not idempotent) retries only the
exception types its author lists: each means the call had no effect, so running it again
keeps the promise of at most one effect. An at-least-once tool retries any
:class:`Exception` unless ``retry_on`` says otherwise. The outcome of the last attempt
carries how many ran (:attr:`wire.models.ErrorInfo.attempts`).
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from executor.errors import ToolDefinitionError
from wire.clock import shared_now
from wire.models import CallOutcome, CallRequest, Delivery, retry_pause_bound

__all__ = [
    "DEFAULT_BACKOFF",
    "MAX_BACKOFF",
    "MAX_RETRIES",
    "NO_RETRIES",
    "Attempts",
    "RetryPolicy",
    "retry_policy",
]

logger = logging.getLogger(__name__)

#: The most retries a tool may ask for.
MAX_RETRIES = 100
#: The longest ``retry_backoff``, in seconds.
MAX_BACKOFF = 3600.0
#: Seconds of the pause before the first retry when ``retry_backoff`` is not given.
DEFAULT_BACKOFF = 0.5


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """How a tool retries: how many times, after which exceptions, how long it pauses."""

    retries: int = 0
    retry_on: tuple[type[Exception], ...] = (Exception,)
    backoff: float = DEFAULT_BACKOFF

    def retries_on(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised by the tool, is one this policy retries."""
        return isinstance(exc, self.retry_on)

    def pause(self, attempt: int, *, rng: Callable[[], float] = random.random) -> float:
        """Seconds to pause after failed attempt ``attempt`` (1 for the first): in the upper
        half of :func:`wire.models.retry_pause_bound`, at random."""
        bound = retry_pause_bound(attempt, self.backoff)
        return bound / 2 + rng() * bound / 2


#: The policy of a tool that never retries.
NO_RETRIES = RetryPolicy()


def retry_policy(
    tool: str, *, retries: Any, retry_on: Any, retry_backoff: Any, delivery: Delivery
) -> RetryPolicy:
    """The checked policy of ``@tool(retries=, retry_on=, retry_backoff=)``.

    Raises:
        ToolDefinitionError: ``retries`` is not a whole number from 0 to
            :data:`MAX_RETRIES`; ``retry_backoff`` is not a number of seconds from 0 to
            :data:`MAX_BACKOFF`; ``retry_on`` is not an exception class or a tuple of
            them, or is given without ``retries``; or an at-most-once tool retries without
            naming the exceptions it retries.
    """
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= MAX_RETRIES:
        raise ToolDefinitionError(
            f"tool {tool!r}: retries must be a whole number from 0 to {MAX_RETRIES}, got "
            f"{retries!r}"
        )
    if (
        isinstance(retry_backoff, bool)
        or not isinstance(retry_backoff, int | float)
        or not math.isfinite(retry_backoff)
        or not 0 <= retry_backoff <= MAX_BACKOFF
    ):
        raise ToolDefinitionError(
            f"tool {tool!r}: retry_backoff must be a number of seconds from 0 to "
            f"{MAX_BACKOFF:g}, got {retry_backoff!r}"
        )
    if retry_on is None:
        if retries and delivery == "at_most_once":
            raise ToolDefinitionError(
                f"tool {tool!r}: an at-most-once tool retries only the exceptions it lists: add "
                "retry_on=(...) with the exception types after which the call had no effect, "
                "e.g. retry_on=(ConnectionError,), or make it idempotent or at-least-once"
            )
        return RetryPolicy(retries=retries, backoff=float(retry_backoff))
    if not retries:
        raise ToolDefinitionError(
            f"tool {tool!r}: retry_on has no effect without retries; set retries=N (1 to "
            f"{MAX_RETRIES})"
        )
    return RetryPolicy(
        retries=retries, retry_on=_exception_types(tool, retry_on), backoff=float(retry_backoff)
    )


def _exception_types(tool: str, retry_on: Any) -> tuple[type[Exception], ...]:
    types = retry_on if isinstance(retry_on, tuple) else (retry_on,)
    if not types:
        raise ToolDefinitionError(
            f"tool {tool!r}: retry_on=() retries nothing; list an exception type"
        )
    for kind in types:
        if not isinstance(kind, type) or not issubclass(kind, BaseException):
            raise ToolDefinitionError(
                f"tool {tool!r}: retry_on takes an exception class or a tuple of them, got {kind!r}"
            )
        if not issubclass(kind, Exception):
            raise ToolDefinitionError(
                f"tool {tool!r}: retry_on lists {kind.__name__}, which is never retried (a cancel, "
                "SystemExit and KeyboardInterrupt end a call): list Exception subclasses only"
            )
    return types


class Attempts:
    """The attempts of one call: counts them, and says whether another may start.

    Args:
        policy: The tool's retry policy.
        call: The call (its deadline, and its ids for the logs).
        hard_timeout: The tool's hard limit: the time each attempt needs before the
            deadline; None to assume the time the last attempt took.
        clock: Monotonic seconds, to time the attempts.
        now: Epoch seconds on the clock deadlines are set by.
        rng: Uniform numbers in [0, 1), for the jitter.
        cancelled: Whether the call was cancelled: then no other attempt starts.
    """

    def __init__(
        self,
        policy: RetryPolicy,
        *,
        call: CallRequest,
        hard_timeout: float | None,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], float] = shared_now,
        rng: Callable[[], float] = random.random,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> None:
        self.policy = policy
        self.call = call
        self.cancelled = cancelled
        self.hard_timeout = hard_timeout
        self.count = 0
        self._clock, self._now, self._rng = clock, now, rng
        self._started = 0.0

    def start(self) -> int:
        """Count an attempt that starts now; its number (1 for the first)."""
        self.count += 1
        self._started = self._clock()
        return self.count

    def pause_after(self, exc: Exception) -> float | None:
        """Seconds to pause before the next attempt, now that this one raised ``exc``;
        None when no other attempt may start (the call ends with ``exc``)."""
        policy, call = self.policy, self.call
        if self.count > policy.retries or not policy.retries_on(exc) or self.cancelled():
            return None
        pause = policy.pause(self.count, rng=self._rng)
        if call.deadline is not None:
            needs = self.hard_timeout
            if needs is None:  # as long as the attempt that just failed took
                needs = self._clock() - self._started
            if self._now() + pause + needs > call.deadline:
                logger.info(
                    "call %s of %s raised %s on attempt %d; not retrying: another attempt "
                    "would end past its deadline",
                    call.call_id,
                    call.tool,
                    type(exc).__name__,
                    self.count,
                    extra=_log_fields(call),
                )
                return None
        logger.info(
            "call %s of %s raised %s on attempt %d of %d; trying again in %.3fs",
            call.call_id,
            call.tool,
            type(exc).__name__,
            self.count,
            policy.retries + 1,
            pause,
            extra=_log_fields(call),
        )
        return pause

    def stamp(self, outcome: CallOutcome) -> CallOutcome:
        """``outcome`` with the number of attempts its error came after."""
        error = outcome.error
        if error is None or self.count <= 1:
            return outcome
        stamped = error.model_copy(update={"attempts": self.count})
        return outcome.model_copy(update={"error": stamped})


def _log_fields(call: CallRequest) -> dict[str, Any]:
    # Imported here: executor.tracing imports executor.context, which imports (through
    # executor.worker) the registry, which imports this module.
    from executor.tracing import call_log_fields

    return call_log_fields(call.call_id, call.run_id, call.tool)
