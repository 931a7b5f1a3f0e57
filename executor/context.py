"""The call context a running tool can read: ``current_call()``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from wire.clock import shared_now

__all__ = ["CallContext", "current_call"]


@dataclass(frozen=True, kw_only=True)
class CallContext:
    """What a tool may know about the call it is running.

    Attributes:
        call_id: Unique id of this dispatch (the Celery task id).
        run_id: The agent run the call belongs to, or None outside a run.
        tool: Registered name of the tool.
        idempotency_key: Set for idempotent tools: pass it downstream (for example as a
            payment API's Idempotency-Key) so a retried call is recognised there too.
        deadline: Epoch seconds at which the caller stops waiting, or None; on the
            clock client and workers share (:func:`wire.clock.shared_now`).
    """

    call_id: str
    run_id: str | None
    tool: str
    idempotency_key: str | None
    deadline: float | None

    def time_left(self) -> float | None:
        """Seconds until the deadline (never negative), or None when there is none."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - shared_now())


_current: ContextVar[CallContext] = ContextVar("toolexec_current_call")


def current_call() -> CallContext:
    """The context of the call this tool is running.

    Raises:
        LookupError: Called outside a tool run (for example, a tool function called
            directly in a test).
    """
    try:
        return _current.get()
    except LookupError:
        raise LookupError("current_call() is only available while a worker runs a tool") from None


@contextmanager
def _calling(context: CallContext) -> Iterator[CallContext]:
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)
