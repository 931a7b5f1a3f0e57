"""The one task that runs a tool, registered under two names, one per delivery mode.

``toolexec.run_tool`` is acknowledged before it runs (at most once);
``toolexec.run_tool_at_least_once`` is acknowledged after and requeued if its worker
process is lost. Both run :func:`run_call`: refuse an expired call, run the tool,
deliver the outcome. Their Celery request frees the running marker of a pool child
that died, so the requeued (or retried) call is not left waiting for it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pydantic
import redis
from billiard.exceptions import WorkerLostError
from celery.worker.request import Request

from executor.idempotency import begin, complete, release
from executor.identity import holder, worker_id
from executor.protocol import (
    TASK_AT_LEAST_ONCE,
    TASK_AT_MOST_ONCE,
    CallOutcome,
    CallRequest,
    should_store,
)
from executor.registry import get_tool
from executor.reply import redis_client
from executor.runner import encode_outcome, execute
from executor.settings import Settings

__all__ = ["finish", "register_tasks", "run_call"]

logger = logging.getLogger(__name__)


def run_call(fields: dict[str, Any], *, settings: Settings, worker: str) -> CallOutcome | None:
    """Run the call described by a task's keyword arguments and deliver its outcome.

    An expired call is refused; an idempotent call whose outcome is stored is answered
    from the store; one another live delivery is running joins it instead of running.
    """
    try:
        call = CallRequest.model_validate(fields)
    except pydantic.ValidationError as exc:
        # Nobody can be told: there is no valid reply address. Drop it, loudly.
        logger.error("dropped a malformed toolexec message: %d problems", exc.error_count())
        return None
    definition = get_tool(call.tool)
    spec = definition.spec if definition is not None else None
    tag = holder(worker)
    client = redis_client(settings)
    now = time.time()
    if call.deadline is not None and now >= call.deadline:
        outcome = execute(call, worker=worker, definition=definition)  # refuses: expired
        finish(call, outcome, settings=settings, store=False, holder=tag)
        return outcome
    hard = spec.hard_timeout if spec is not None and spec.hard_timeout else 0.0
    window = (call.deadline - now) if call.deadline is not None else settings.outcome_ttl
    ttl_ms = int((window + hard + settings.claim_margin) * 1000)
    state, value = begin(client, call, holder=tag, hostname=worker, ttl_ms=ttl_ms)
    if state == "busy":
        logger.info("call %s of %s joined the delivery already running it", call.call_id, call.tool)
        return None
    if state == "stored":
        logger.info("call %s of %s answered from its stored outcome", call.call_id, call.tool)
        _complete(client, call, value, settings=settings, store=False, holder=tag)
        return CallOutcome.model_validate_json(value)
    outcome = execute(call, worker=worker, definition=definition)
    finish(call, outcome, settings=settings, store=should_store(spec, outcome), holder=tag)
    return outcome


def finish(
    call: CallRequest, outcome: CallOutcome, *, settings: Settings, store: bool = False, holder: str = ""
) -> None:
    """Deliver ``outcome`` to the caller of ``call`` (and its joiners); store it if asked."""
    encoded = encode_outcome(outcome, tool=call.tool, max_bytes=settings.max_result_bytes)
    _complete(redis_client(settings), call, encoded, settings=settings, store=store, holder=holder)


def _complete(
    client: redis.Redis, call: CallRequest, encoded: str, *, settings: Settings, store: bool, holder: str
) -> None:
    try:
        complete(
            client, call, encoded, store=store, holder=holder,
            outcome_ttl=settings.outcome_ttl, reply_ttl=settings.reply_ttl,
        )  # fmt: skip
    except redis.RedisError as exc:
        logger.error("could not deliver the outcome of call %s: %s", call.call_id, exc)


def _request_class(settings: Settings) -> type:
    class ToolRequest(Request):  # type: ignore[misc]
        """Celery's request, which also frees the running marker of a pool child that died.

        Runs in the worker's main process, before Celery requeues the message
        (at-least-once) or reports the loss (at-most-once).
        """

        def on_failure(
            self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
        ) -> Any:
            exc = getattr(exc_info, "exception", None)
            exc = getattr(exc, "exc", exc)  # unwrap billiard's ExceptionWithTraceback
            if isinstance(exc, WorkerLostError) and self.worker_pid:
                tag = f"{worker_id(self.hostname or '')}|{self.worker_pid}"
                _release_dead_child(self.kwargs, settings=settings, tag=tag)
            return super().on_failure(exc_info, send_failed_event, return_ok)

    return ToolRequest


def _release_dead_child(fields: Any, *, settings: Settings, tag: str) -> None:
    try:
        call = CallRequest.model_validate(fields)
        release(redis_client(settings), call, holder=tag)
    except Exception as exc:  # noqa: BLE001 - Celery's own handling must still run
        logger.warning("could not release the marker of a lost call: %s", type(exc).__name__)


def register_tasks(app: Any, settings: Settings, backend: Any) -> None:
    """Register both delivery modes of the task on ``app``."""

    def run_tool(self: Any, **fields: Any) -> None:
        run_call(fields, settings=settings, worker=self.request.hostname or "")

    common: dict[str, Any] = {
        "bind": True, "ignore_result": True, "typing": False, "backend": backend,
        "Request": _request_class(settings),
    }  # fmt: skip
    app.task(name=TASK_AT_MOST_ONCE, acks_late=False, **common)(run_tool)
    app.task(
        name=TASK_AT_LEAST_ONCE,
        acks_late=True,
        reject_on_worker_lost=True,
        acks_on_failure_or_timeout=True,
        **common,
    )(run_tool)
