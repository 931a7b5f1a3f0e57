"""Report what the worker's main process sees happen to a call.

When a prefork child dies mid-call, or Celery's own hard time limit ends it, or the
main process drops an expired message, or gives up an at-least-once call whose process
died ``TOOLEXEC_MAX_DELIVERIES`` times (:mod:`executor.seams.request`), the task body
never gets to reply: Celery then calls the task's result backend from the main process.
This backend turns those calls into outcomes for the waiting client
(:func:`executor.delivery.finish`), so a lost call is reported at once instead of
running into its deadline.
"""

from __future__ import annotations

import logging
from typing import Any

from billiard.exceptions import TimeLimitExceeded, WorkerLostError
from celery.backends.base import DisabledBackend

from executor.delivery import finish
from executor.errors import DeliveriesExhausted, StoreUnavailable, ToolCallFailed
from executor.registry import get_tool
from executor.tracing import call_log_fields
from wire.models import CallOutcome, CallRequest, ErrorKind, should_store
from wire.settings import Settings

__all__ = ["ReplyBackend"]

logger = logging.getLogger(__name__)


class ReplyBackend(DisabledBackend):  # type: ignore[misc]
    """A result backend that stores nothing and tells callers about lost calls."""

    def __init__(self, app: Any, settings: Settings, **kwargs: Any) -> None:
        super().__init__(app=app, **kwargs)
        self.toolexec_settings = settings

    def mark_as_failure(
        self, task_id: str, exc: BaseException, *args: Any, request: Any = None, **kwargs: Any
    ) -> None:
        if isinstance(exc, ToolCallFailed):
            return  # the task body delivered this call's outcome, then ended as a failure
        if isinstance(exc, WorkerLostError):
            kind, type_name = ErrorKind.WORKER_LOST, "WorkerLost"
            message = f"the worker process running this call died ({exc})"
        elif isinstance(exc, DeliveriesExhausted | StoreUnavailable):
            # executor.seams.request gave up redelivering it, or executor.task could not begin it.
            kind, type_name, message = ErrorKind.WORKER_LOST, "WorkerLost", str(exc)
        elif isinstance(exc, TimeLimitExceeded):
            kind, type_name = ErrorKind.HARD_TIMEOUT, "ToolHardTimeout"
            message = f"the call ran past its hard limit and its worker process was stopped ({exc})"
        else:
            kind, type_name = ErrorKind.EXECUTION, type(exc).__name__
            message = str(exc)
        self._report(task_id, request, kind, type_name, message)

    def mark_as_revoked(
        self, task_id: str, reason: str = "", *args: Any, request: Any = None, **kwargs: Any
    ) -> None:
        if reason == "expired":
            kind, message = (
                ErrorKind.EXPIRED,
                "the deadline passed before a worker started this call",
            )
        else:
            kind, message = ErrorKind.WORKER_LOST, f"the call was revoked ({reason})"
        self._report(
            task_id, request, kind, "DeadlineExpired" if reason == "expired" else "Revoked", message
        )

    def _report(
        self, task_id: str, request: Any, kind: ErrorKind, type_name: str, message: str
    ) -> None:
        kwargs = getattr(request, "kwargs", None) or {}
        try:
            call = CallRequest.model_validate(kwargs)
        except Exception:  # noqa: BLE001 - a malformed message has nobody to tell
            logger.warning(
                "call %s ended (%s) but its message names no caller", task_id, kind.value
            )
            return
        hostname = getattr(request, "hostname", "") or ""
        outcome = CallOutcome.failure(call.call_id, kind, type_name, message, worker=hostname)
        logger.warning(
            "call %s of %s: %s",
            call.call_id,
            call.tool,
            kind.value,
            extra=call_log_fields(call.call_id, call.run_id, call.tool),
        )
        definition = get_tool(call.tool)
        store = should_store(definition.spec if definition else None, outcome)
        finish(call, outcome, settings=self.toolexec_settings, store=store)
