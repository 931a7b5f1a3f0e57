"""The one task that runs a tool, registered under two names, one per delivery mode.

``toolexec.run_tool`` is acknowledged before it runs (at most once);
``toolexec.run_tool_at_least_once`` is acknowledged after and requeued if its worker
process is lost. Both run :func:`run_call`: refuse an expired call, begin (an
idempotent call may be answered from its stored outcome or join a running delivery),
run the tool, deliver the outcome. On the asyncio pool (:mod:`executor.pools`) the task's
async body, :func:`run_call_async`, takes the same steps (:func:`admit`, then
:func:`conclude`) with its Redis round trips in the pool's I/O threads and the tool
awaited on the pool's event loop.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pydantic
import redis

from executor.backend import ReplyBackend
from executor.exits import StoreUnavailable, retire_if_runaway
from executor.holding import hold, holds_before_ack
from executor.idempotency import complete, queue_reply
from executor.identity import holder, in_pool_child
from executor.metrics import observe_run, record_outcome
from executor.progress import close_progress, open_progress
from executor.redis_client import FIRST_PAUSE, redis_client, retry_pauses
from executor.registry import get_tool
from executor.request import request_class
from executor.runner import encode_outcome, execute, execute_async, refuse_if_expired
from executor.running_here import Admitted, running_here
from executor.signatures import check_signature, signed_headers_of
from executor.stats import record as count_outcome
from executor.tracing import ToolCallFailed, call_log_fields, call_span
from wire import keys
from wire.models import (
    TASK_AT_LEAST_ONCE,
    TASK_AT_MOST_ONCE,
    CallOutcome,
    CallRequest,
    should_store,
)
from wire.scripts import BeginState
from wire.settings import Settings
from wire.signing import SIGNATURE_HEADER

if TYPE_CHECKING:
    from executor.pools.offload import Offload

__all__ = ["Admitted", "admit", "conclude", "finish", "register_tasks", "run_call", "run_call_async"]

logger = logging.getLogger(__name__)


def run_call(fields: dict[str, Any], *, settings: Settings, worker: str) -> CallOutcome | None:
    """Run the call described by a task's keyword arguments and deliver its outcome.

    An expired call is refused; an idempotent call whose outcome is stored is answered
    from the store; one another live delivery is running joins it instead of running.
    Returns the outcome delivered, or None when this delivery delivered nothing.
    """
    admitted = admit(fields, settings=settings, worker=worker)
    if not isinstance(admitted, Admitted):
        return admitted
    try:
        with observe_run(admitted.call.tool):
            outcome = execute(admitted.call, worker=worker, definition=admitted.definition)
    except BaseException:
        running_here.abandon(admitted)
        raise
    return conclude(admitted, outcome, settings=settings)


async def run_call_async(
    fields: dict[str, Any], *, settings: Settings, worker: str, offload: Offload
) -> CallOutcome | None:
    """:func:`run_call` on the asyncio pool: the tool is awaited on the running loop.

    ``offload`` runs the blocking steps (:func:`admit`, :func:`conclude`: Redis round
    trips) in the pool's I/O threads, so the loop never waits on Redis. A plain call
    (no idempotency key) that the deadline check lets through is admitted on the loop
    itself: its admission sends nothing to Redis, and a trip through an I/O thread
    would cost more than the step.
    """
    call = _validated(fields)
    if call is None:
        return None
    refusal = refuse_if_expired(call, worker=worker)  # the one deadline check
    if refusal is None and call.idempotency_key is None:
        admitted = _admit_call(call, None, settings=settings, worker=worker)  # no Redis
    else:
        admitted = await offload(
            functools.partial(_admit_call, call, refusal, settings=settings, worker=worker)
        )
    if not isinstance(admitted, Admitted):
        return admitted
    try:
        with observe_run(admitted.call.tool):
            outcome = await execute_async(admitted.call, worker=worker, definition=admitted.definition)
    except BaseException:
        running_here.abandon(admitted)
        raise
    if admitted.call.idempotency_key is None:
        # Plain calls that end at the same moment share one pipeline (_conclude_plain).
        return await offload.batched(_conclude_plain, (admitted, outcome, settings))
    return await offload(functools.partial(conclude, admitted, outcome, settings=settings))


def admit(fields: dict[str, Any], *, settings: Settings, worker: str) -> Admitted | CallOutcome | None:
    """The steps before a call runs: validate it, refuse it if expired, begin it.

    Returns :class:`Admitted` when the tool must run in this delivery; otherwise what this
    delivery delivered: the refusal or the stored outcome, or None (a malformed message,
    or a call that joined the delivery already running it).
    """
    call = _validated(fields)
    if call is None:
        return None
    return _admit_call(call, refuse_if_expired(call, worker=worker), settings=settings, worker=worker)


def _validated(fields: dict[str, Any]) -> CallRequest | None:
    """The call in a task's keyword arguments; None (logged) when they are not one."""
    try:
        return CallRequest.model_validate(fields)
    except pydantic.ValidationError as exc:
        # Nobody can be told: there is no valid reply address. Drop it, loudly.
        logger.error("dropped a malformed toolexec message: %d problems", exc.error_count())
        return None


def _admit_call(
    call: CallRequest, refusal: CallOutcome | None, *, settings: Settings, worker: str
) -> Admitted | CallOutcome | None:
    """:func:`admit` for a valid call, given what the deadline check said of it.

    ``refusal`` is :func:`~executor.runner.refuse_if_expired`'s answer. Sends nothing
    to Redis for a plain call it let through (the worker's heartbeat records who runs
    a plain call once it has run for a moment, :mod:`executor.heartbeat`), but on
    RabbitMQ, where a prefork child records who holds an at-most-once call before its
    tool starts (:mod:`executor.holding`).
    """
    tag = holder(worker)
    if refusal is not None:
        finish(call, refusal, settings=settings, store=False, holder=tag)
        return refusal
    definition = get_tool(call.tool)
    if (
        definition is not None and definition.spec.delivery == "at_most_once"
        and in_pool_child() and holds_before_ack(settings, acks_late=False)
    ):  # fmt: skip
        hold(redis_client(settings), call.call_id, tag, interval=settings.heartbeat_interval)
    if call.idempotency_key is None:
        open_progress(call, settings)  # report_progress() reaches the caller from now on
        return Admitted(call=call, definition=definition, holder=tag)
    client = redis_client(settings)
    ttl_ms = keys.call_ttl_ms(
        "running", deadline=call.deadline, settings=settings,
        hard_timeout=definition.spec.hard_timeout if definition is not None else None,
    )  # fmt: skip
    begun = _begin_patiently(
        client, call, call.idempotency_key, tag=tag, worker=worker, ttl_ms=ttl_ms,
        patience=settings.heartbeat_interval,
    )  # fmt: skip
    if isinstance(begun, CallOutcome):
        finish(call, begun, settings=settings, store=False, holder=tag)
        return begun
    state, value, tag, key_lock = begun
    if state == "busy":
        logger.info(
            "call %s of %s joined the delivery already running it", call.call_id, call.tool,
            extra=call_log_fields(call.call_id, call.run_id, call.tool),
        )  # fmt: skip
        return None
    if state == "stored":
        logger.info(
            "call %s of %s answered from its stored outcome", call.call_id, call.tool,
            extra=call_log_fields(call.call_id, call.run_id, call.tool),
        )  # fmt: skip
        _complete(client, call, value, settings=settings, store=False, holder=tag)
        return CallOutcome.model_validate_json(value)
    open_progress(call, settings)  # report_progress() reaches the caller from now on
    return Admitted(call=call, definition=definition, holder=tag, key_lock=key_lock)


#: How long a worker keeps trying to begin an idempotent call while Redis is unreachable.
_BEGIN_PATIENCE = 10.0


def _begin_patiently(
    client: redis.Redis, call: CallRequest, key: str, *, tag: str, worker: str, ttl_ms: int, patience: float
) -> tuple[BeginState, str, str, threading.Lock | None] | CallOutcome:
    """Begin a keyed call, trying again while Redis is unreachable (it restarts, say).

    Trying again is safe: a state the lost attempt took holds this delivery's own tag,
    and the begin script takes it again. The call has not run yet, so when its deadline
    passes meanwhile it is refused as expired; when Redis stays away for
    :data:`_BEGIN_PATIENCE`, :class:`StoreUnavailable` ends the delivery.
    """
    pauses = retry_pauses(_BEGIN_PATIENCE)
    while True:
        try:
            return running_here.begin(
                client, call, key, tag=tag, worker=worker, ttl_ms=ttl_ms, patience=patience
            )
        except redis.RedisError as exc:
            refusal = refuse_if_expired(call, worker=worker)
            if refusal is not None:
                return refusal
            pause = next(pauses, None)
            if pause is None:
                raise StoreUnavailable(_BEGIN_PATIENCE, exc) from exc
            if pause == FIRST_PAUSE:  # once per call, not per attempt
                logger.warning(
                    "could not begin call %s of %s (%s); trying again", call.call_id, call.tool,
                    type(exc).__name__, extra=call_log_fields(call.call_id, call.run_id, call.tool),
                )  # fmt: skip
            time.sleep(pause)


def conclude(admitted: Admitted, outcome: CallOutcome, *, settings: Settings) -> CallOutcome:
    """Deliver the outcome of an admitted call, stored when its tool keeps outcomes; return it."""
    close_progress(admitted.call)  # its last progress report goes before the outcome
    spec = admitted.definition.spec if admitted.definition is not None else None
    store = should_store(spec, outcome)
    deliver = functools.partial(
        finish, admitted.call, outcome, settings=settings, store=store, holder=admitted.holder
    )
    running_here.complete(admitted, deliver)
    return outcome


def _conclude_plain(
    concluded: list[tuple[Admitted, CallOutcome, Settings]],
) -> list[CallOutcome | BaseException]:
    """:func:`conclude` for many plain calls (no idempotency key) at once: one pipeline.

    What :func:`finish` does for each, with the outcome pushes of all the calls in one
    Redis round trip, tried again through a Redis blip as :func:`_complete` does. Returns
    each call's outcome, or the exception that kept it from being delivered.
    """
    results: list[CallOutcome | BaseException] = []
    pushes: dict[int, tuple[Settings, list[tuple[CallRequest, str]]]] = {}
    for admitted, outcome, settings in concluded:
        call = admitted.call
        try:
            if call.idempotency_key is not None:
                raise ValueError(f"call {call.call_id} has an idempotency key: conclude it alone")
            close_progress(call)  # its last progress report goes before the outcome
            record_outcome(call.tool, outcome)
            count_outcome(call.tool, outcome, redis_url=settings.redis_url)
            encoded = encode_outcome(outcome, tool=call.tool, max_bytes=settings.max_result_bytes)
        except Exception as exc:  # noqa: BLE001 - this call's failure, not the others'
            results.append(exc)
            continue
        pushes.setdefault(id(settings), (settings, []))[1].append((call, encoded))
        results.append(outcome)
    for settings, delivered in pushes.values():
        _complete_plain(redis_client(settings), delivered, settings=settings)
    return results


def finish(
    call: CallRequest, outcome: CallOutcome, *, settings: Settings, store: bool = False, holder: str = ""
) -> None:
    """Deliver ``outcome`` to the caller of ``call`` (and its joiners); store it if asked."""
    record_outcome(call.tool, outcome)
    count_outcome(call.tool, outcome, redis_url=settings.redis_url)  # for `toolexec status`
    encoded = encode_outcome(outcome, tool=call.tool, max_bytes=settings.max_result_bytes)
    _complete(redis_client(settings), call, encoded, settings=settings, store=store, holder=holder)


#: How long a worker keeps trying to deliver an outcome while Redis is unreachable.
_DELIVERY_PATIENCE = 5.0


def _complete(
    client: redis.Redis, call: CallRequest, encoded: str, *, settings: Settings, store: bool, holder: str
) -> None:
    # A second COMPLETE after a first that landed only pushes a duplicate frame, which
    # the client drops (nobody waits for that call id any more).
    def deliver() -> None:
        complete(
            client, call, encoded, store=store, holder=holder,
            outcome_ttl=settings.outcome_ttl, reply_ttl=settings.reply_ttl,
        )  # fmt: skip

    _through_blips(deliver, [call])


def _complete_plain(
    client: redis.Redis, delivered: list[tuple[CallRequest, str]], *, settings: Settings
) -> None:
    """:func:`_complete` for many plain calls: their replies pushed in one pipeline.

    A second push after one that landed is a duplicate frame, which the client drops.
    """

    def deliver() -> None:
        pipe = client.pipeline(transaction=False)
        for call, encoded in delivered:
            queue_reply(pipe, call, encoded, reply_ttl=settings.reply_ttl)
        if len(pipe):
            pipe.execute()

    _through_blips(deliver, [call for call, _ in delivered])


def _through_blips(deliver: Callable[[], None], calls: list[CallRequest]) -> None:
    """Run ``deliver``, trying again with backoff for :data:`_DELIVERY_PATIENCE` while
    Redis errs: a Redis blip must not lose an outcome. Logs each call it gave up."""
    pauses = retry_pauses(_DELIVERY_PATIENCE)
    while True:
        try:
            deliver()
            return
        except redis.RedisError as exc:
            pause = next(pauses, None)
            if pause is None:
                for call in calls:
                    logger.error(
                        "could not deliver the outcome of call %s of %s: %s", call.call_id, call.tool, exc,
                        extra=call_log_fields(call.call_id, call.run_id, call.tool),
                    )  # fmt: skip
                return
            time.sleep(pause)



def _forget_frames(self: Any, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
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


def register_tasks(app: Any, settings: Settings) -> None:
    """Register both delivery modes of the task on ``app``, with the reply backend."""

    def signed(task_name: str, request: Any, fields: dict[str, Any]) -> bool:
        # With TOOLEXEC_SIGNING_KEY, before anything trusts the fields (executor.signatures).
        info = getattr(request, "delivery_info", None) or {}
        return check_signature(
            fields, settings=settings, worker=request.hostname or "", task_name=task_name,
            signature=getattr(request, SIGNATURE_HEADER, None), headers=signed_headers_of(request),
            queue=str(info.get("routing_key") or ""),
        )  # fmt: skip

    def run_tool(self: Any, **fields: Any) -> None:
        if settings.signing_key is not None and not signed(self.name, self.request, fields):
            return
        with call_span(self.request, fields) as span:
            outcome = run_call(fields, settings=settings, worker=self.request.hostname or "")
            span.record(outcome)
        # The outcome is delivered. A prefork child still running a tool past its hard
        # limit now leaves, and billiard starts a fresh one (executor.exits).
        retire_if_runaway()
        _end_as_failure_if_failed(outcome)

    async def run_tool_async(self: Any, request: Any, offload: Offload, **fields: Any) -> None:
        # The async body the asyncio pool awaits (executor.pools.trace.AsyncTask).
        if settings.signing_key is not None and not await offload(
            functools.partial(signed, self.name, request, fields)
        ):
            return
        with call_span(request, fields) as span:
            outcome = await run_call_async(fields, settings=settings, worker=request.hostname or "", offload=offload)
            span.record(outcome)
        _end_as_failure_if_failed(outcome)

    backend = ReplyBackend(app=app, settings=settings, finish=finish)
    common: dict[str, Any] = {
        "bind": True, "ignore_result": True, "typing": False, "backend": backend,
        "Request": request_class(settings), "run_async": run_tool_async,
        # Refuse a malformed message as InvalidTaskError (dead-lettered by the consumer).
        "Strategy": "executor.strategy:strategy",
        # Bound to this app's settings: never added to apps made later in the process.
        "shared": False,
        # A failed call ends its task as a failure, after its outcome is delivered, so
        # Celery's events (Flower) show it failed; expected: logged at INFO, no traceback.
        "throws": (ToolCallFailed,),
        "on_failure": _forget_frames,
    }  # fmt: skip
    app.task(name=TASK_AT_MOST_ONCE, acks_late=False, **common)(run_tool)
    app.task(
        name=TASK_AT_LEAST_ONCE,
        acks_late=True,
        reject_on_worker_lost=True,
        acks_on_failure_or_timeout=True,
        **common,
    )(run_tool)
