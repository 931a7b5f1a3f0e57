"""The one task that runs a tool, registered under two names, one per delivery mode.

``toolexec.run_tool`` is acknowledged before it runs (at most once);
``toolexec.run_tool_at_least_once`` is acknowledged after and requeued if its worker
process is lost. Both run :func:`run_call`: refuse an expired call, run the tool,
deliver the outcome.
"""

from __future__ import annotations

import logging
from typing import Any

import pydantic
import redis

from executor.protocol import TASK_AT_LEAST_ONCE, TASK_AT_MOST_ONCE, CallOutcome, CallRequest
from executor.reply import deliver, redis_client
from executor.runner import encode_outcome, execute
from executor.settings import Settings

__all__ = ["finish", "register_tasks", "run_call"]

logger = logging.getLogger(__name__)


def run_call(fields: dict[str, Any], *, settings: Settings, worker: str) -> CallOutcome | None:
    """Run the call described by a task's keyword arguments and deliver its outcome."""
    try:
        call = CallRequest.model_validate(fields)
    except pydantic.ValidationError as exc:
        # Nobody can be told: there is no valid reply address. Drop it, loudly.
        logger.error("dropped a malformed toolexec message: %d problems", exc.error_count())
        return None
    outcome = execute(call, worker=worker)
    finish(call, outcome, settings=settings)
    return outcome


def finish(call: CallRequest, outcome: CallOutcome, *, settings: Settings, store: bool = True) -> None:
    """Deliver ``outcome`` to the caller of ``call``."""
    encoded = encode_outcome(outcome, tool=call.tool, max_bytes=settings.max_result_bytes)
    try:
        deliver(redis_client(settings), call, encoded, settings=settings)
    except redis.RedisError as exc:
        logger.error("could not deliver the outcome of call %s: %s", call.call_id, exc)


def register_tasks(app: Any, settings: Settings, backend: Any) -> None:
    """Register both delivery modes of the task on ``app``."""

    def run_tool(self: Any, **fields: Any) -> None:
        run_call(fields, settings=settings, worker=self.request.hostname or "")

    common: dict[str, Any] = dict(bind=True, ignore_result=True, typing=False, backend=backend)
    app.task(name=TASK_AT_MOST_ONCE, acks_late=False, **common)(run_tool)
    app.task(
        name=TASK_AT_LEAST_ONCE,
        acks_late=True,
        reject_on_worker_lost=True,
        acks_on_failure_or_timeout=True,
        **common,
    )(run_tool)
