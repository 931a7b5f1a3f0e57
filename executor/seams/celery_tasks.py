"""toolexec's two Celery tasks: Celery at the edge, the call's steps inside.

``toolexec.run_tool`` is acknowledged before it runs (at most once);
``toolexec.run_tool_at_least_once`` is acknowledged after and requeued if its worker
process is lost. Both are one body over :func:`executor.task.run_call` (and, on the
asyncio pool, :func:`executor.task.run_call_async`). Before the call's steps begin, the
body reads what only Celery's request knows of this delivery: whether this copy went back
on its queue when the broker connection broke (:mod:`executor.seams.put_back`), the
message's signature (:mod:`executor.seams.signatures`), its generation
(:mod:`executor.seams.request`) and the worker's name. After them, a failed call ends its
task as a failure, so Celery's events (Flower) show it failed.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

from executor.errors import ToolCallFailed
from executor.limits import retire_if_runaway
from executor.seams.backend import ReplyBackend
from executor.seams.put_back import COPY_KEY, LEDGER
from executor.seams.request import GENERATION_KEY, request_class
from executor.seams.signatures import check_signature, signed_headers_of
from executor.task import run_call, run_call_async
from executor.tracing import call_span
from wire.models import TASK_AT_LEAST_ONCE, TASK_AT_MOST_ONCE, CallOutcome
from wire.settings import Settings
from wire.signing import SIGNATURE_HEADER

if TYPE_CHECKING:
    from executor.pools.offload import Offload

__all__ = ["register_tasks"]

logger = logging.getLogger(__name__)


def _forget_frames(
    self: Any, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
) -> None:
    """Celery's ``Task.on_failure``: drop the exception's traceback (``einfo`` keeps its text).

    Right after this hook, Celery's trace clears every frame of the traceback against
    leaks (``celery.app.trace.traceback_clear``). On the asyncio pool one of those frames
    is the pool's coroutine that awaits this very step in another thread: clearing a
    suspended coroutine's frame closes it, so the request's callback never ran, a
    late-acknowledged call was never acknowledged and its prefetch slot was lost (after
    ``-c`` failed at-least-once calls the worker took no more), and the finished call
    stayed "held" in the worker's heartbeat.
    """
    exc.__traceback__ = None


def _end_as_failure_if_failed(outcome: CallOutcome | None) -> None:
    """Raise :class:`ToolCallFailed` (type and kind only) when the delivered outcome is an error."""
    failure = None if outcome is None else ToolCallFailed.of(outcome)
    if failure is not None:
        raise failure


def _put_back_here(request: Any, *, wait: bool = True) -> bool | None:
    """Whether this copy of the delivery went back on its queue when the broker connection
    broke (:mod:`executor.seams.put_back`): then the copy taken again runs, not this one.
    Without ``wait``, None while a put-back of it is under way."""
    may_run = LEDGER.begin(getattr(request, COPY_KEY, None), wait=wait)
    if may_run is None or may_run:
        return None if may_run is None else False
    logger.info(
        "call %s: this copy does not run: it went back on its queue when the broker connection "
        "broke",
        request.id,
    )
    return True


def register_tasks(app: Any, settings: Settings) -> None:
    """Register both delivery modes of the task on ``app``, with the reply backend."""

    def signed(task_name: str, request: Any, fields: dict[str, Any]) -> bool:
        # With TOOLEXEC_SIGNING_KEY, before anything trusts the fields (executor.seams.lockdown).
        info = getattr(request, "delivery_info", None) or {}
        return check_signature(
            fields,
            settings=settings,
            worker=request.hostname or "",
            task_name=task_name,
            signature=getattr(request, SIGNATURE_HEADER, None),
            headers=signed_headers_of(request),
            queue=str(info.get("routing_key") or ""),
        )

    def run_tool(self: Any, **fields: Any) -> None:
        if _put_back_here(self.request):
            return
        if settings.signing_key is not None and not signed(self.name, self.request, fields):
            return
        with call_span(self.request, fields) as span:
            outcome = run_call(
                fields,
                settings=settings,
                worker=self.request.hostname or "",
                generation=getattr(self.request, GENERATION_KEY, None),
            )
            span.record(outcome)
        # The outcome is delivered. A prefork child still running a tool past its hard
        # limit now leaves, and billiard starts a fresh one (executor.limits).
        retire_if_runaway()
        _end_as_failure_if_failed(outcome)

    async def run_tool_async(self: Any, request: Any, offload: Offload, **fields: Any) -> None:
        # The async body the asyncio pool awaits (executor.pools.trace.AsyncTask).
        put_back_here = _put_back_here(request, wait=False)
        if put_back_here is None:  # a put-back of it is under way: wait off the loop
            put_back_here = await offload(functools.partial(_put_back_here, request))
        if put_back_here:
            return
        if settings.signing_key is not None and not await offload(
            functools.partial(signed, self.name, request, fields)
        ):
            return
        with call_span(request, fields) as span:
            outcome = await run_call_async(
                fields,
                settings=settings,
                worker=request.hostname or "",
                offload=offload,
                generation=getattr(request, GENERATION_KEY, None),
            )
            span.record(outcome)
        _end_as_failure_if_failed(outcome)

    backend = ReplyBackend(app=app, settings=settings)
    common: dict[str, Any] = {
        "bind": True,
        "ignore_result": True,
        "typing": False,
        "backend": backend,
        "Request": request_class(settings),
        "run_async": run_tool_async,
        # Refuse a malformed message as InvalidTaskError (dead-lettered by the consumer).
        "Strategy": "executor.seams.request:strategy",
        # Bound to this app's settings: never added to apps made later in the process.
        "shared": False,
        # A failed call ends its task as a failure, after its outcome is delivered, so
        # Celery's events (Flower) show it failed; expected: logged at INFO, no traceback.
        "throws": (ToolCallFailed,),
        "on_failure": _forget_frames,
    }
    app.task(name=TASK_AT_MOST_ONCE, acks_late=False, **common)(run_tool)
    app.task(
        name=TASK_AT_LEAST_ONCE,
        acks_late=True,
        reject_on_worker_lost=True,
        acks_on_failure_or_timeout=True,
        **common,
    )(run_tool)
