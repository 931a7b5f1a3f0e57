"""A call's steps in the worker, below Celery: refuse, admit, run, conclude.

:func:`run_call` takes a call from its task's keyword arguments to its delivered outcome:
refuse an expired call or one whose caller no longer waits, admit it (an idempotent call
may be answered from its stored outcome or join a running delivery; a copy sent again asks
whether it may start), run the tool, deliver the outcome. On the asyncio pool
(:mod:`executor.pools`) :func:`run_call_async` takes the same steps (:func:`admit`, then
:func:`conclude`) with its Redis round trips in the pool's I/O threads and an ``async
def`` tool awaited on the pool's event loop; a ``def`` tool runs, and its outcome leaves,
from one of the pool's tool threads. The outcome reaches its caller through
:mod:`executor.delivery`.

Nothing here knows Celery's request or the broker's channel: the two Celery tasks that
call these steps, and what they read of a delivery first, are the edge's
(:mod:`executor.seams.celery_tasks`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import copy_context
from typing import TYPE_CHECKING, Any

import pydantic
import redis

from executor import cancel_state, cancels, observe
from executor.callers import caller_known_waiting, caller_waits, caller_waits_async, look, shed
from executor.claims import (
    Admitted,
    hold,
    holds_before_ack,
    may_start,
    running_here,
)
from executor.context import close_progress, open_progress
from executor.delivery import deliver_encoded, finish, mark_running, push_plain, record_and_encode
from executor.errors import ReplicasBehind, StoreUnavailable
from executor.registry import get_tool
from executor.runner import execute, execute_async, refuse_if_expired
from executor.tracing import call_log_fields
from executor.worker import FIRST_PAUSE, holder, in_pool_child, redis_client, retry_pauses
from wire import keys
from wire.models import (
    CallOutcome,
    CallRequest,
    ErrorKind,
    should_store,
)
from wire.scripts import BeginState
from wire.settings import Settings

if TYPE_CHECKING:
    from executor.pools.offload import Offload

__all__ = ["admit", "conclude", "run_call", "run_call_async"]

logger = logging.getLogger(__name__)


def run_call(
    fields: dict[str, Any], *, settings: Settings, worker: str, generation: int | None = None
) -> CallOutcome | None:
    """Run the call described by a task's keyword arguments and deliver its outcome.

    An expired call is refused; a copy sent again (``generation``, :mod:`wire.copies`)
    that the client gave up on, or sent again since, does not run; an idempotent call
    whose outcome is stored is answered from the store; one another live delivery is
    running joins it instead of running. Returns the outcome delivered, or None when
    this delivery delivered nothing.
    """
    admitted = admit(fields, settings=settings, worker=worker, generation=generation)
    if not isinstance(admitted, Admitted):
        return admitted
    outcome = _run_here(admitted, settings=settings, worker=worker)
    return None if outcome is None else conclude(admitted, outcome, settings=settings)


async def run_call_async(
    fields: dict[str, Any],
    *,
    settings: Settings,
    worker: str,
    offload: Offload,
    generation: int | None = None,
) -> CallOutcome | None:
    """:func:`run_call` on the asyncio pool: the tool is awaited on the running loop.

    ``offload`` runs the blocking steps (:func:`admit`, :func:`conclude`: Redis round
    trips) in the pool's I/O threads, so the loop never waits on Redis; a ``def`` tool's
    call ends in one of the pool's tool threads (:func:`_run_in_tool_thread`). A plain call
    (no idempotency key) that the deadline check lets through is admitted on the loop
    itself: its admission sends nothing to Redis, and a trip through an I/O thread
    would cost more than the step.
    """
    call = _validated(fields)
    if call is None:
        return None
    refusal = refuse_if_expired(call, worker=worker)  # the one deadline check
    if (
        refusal is None
        and call.idempotency_key is None
        and generation is None
        and caller_known_waiting(call)
    ):
        admitted = _admit_call(call, None, settings=settings, worker=worker)  # no Redis
    else:
        if refusal is None and not caller_known_waiting(call):
            # Asked here, not in an I/O thread: while its verdict is out the call waits on
            # the loop, and the I/O threads serve the other calls.
            looking = functools.partial(look, redis_client(settings), call, settings=settings)
            if not await caller_waits_async(lambda: offload(looking), call, settings=settings):
                refusal = shed(call, worker=worker, settings=settings)
        admitting = functools.partial(
            _admit_call,
            call,
            refusal,
            settings=settings,
            worker=worker,
            generation=generation,
            ask_caller=False,
        )
        if _waits_for_replicas(call, settings):
            admitted = await asyncio.get_running_loop().run_in_executor(None, admitting)
        else:
            admitted = await offload(admitting)
    if not isinstance(admitted, Admitted):
        return admitted
    if admitted.definition is not None and not admitted.definition.is_async:
        return await _run_in_tool_thread(
            admitted, settings=settings, worker=worker, offload=offload
        )
    with _running(admitted, settings, worker) as answers:
        starting = functools.partial(
            _refusal_at_start, admitted.call, settings=settings, worker=worker
        )
        outcome = await execute_async(
            admitted.call, worker=worker, definition=admitted.definition, starting=starting
        )
    if not answers():
        return None
    if admitted.call.idempotency_key is None:
        # Plain calls that end at the same moment share one pipeline (_conclude_plain).
        return await offload.deliver_batched(_conclude_plain, (admitted, outcome, settings))
    concluding = functools.partial(conclude, admitted, outcome, settings=settings)
    if _waits_for_replicas(admitted.call, settings):
        return await asyncio.get_running_loop().run_in_executor(None, concluding)
    return await offload.deliver(concluding)


def _waits_for_replicas(call: CallRequest, settings: Settings) -> bool:
    """Whether a keyed call's begin and stored outcome wait for replicas
    (``TOOLEXEC_REPLICA_ACKS``). On the asyncio pool those steps then take one of the
    tool threads, not the I/O or delivery threads every call shares: a lagging replica
    holds up the keyed calls, not every other call's admission and outcome."""
    return bool(settings.replica_acks) and call.idempotency_key is not None


def _run_here(admitted: Admitted, *, settings: Settings, worker: str) -> CallOutcome | None:
    """Run the admitted call's tool in this thread: its outcome, or None when this delivery
    no longer answers the call (its cancel's grace answered it, :mod:`executor.cancels`).

    The tool checks the call once more as it starts (:func:`_refusal_at_start`): on a pool
    whose calls wait for a thread, its caller may have died or its deadline passed meanwhile.
    """
    with _running(admitted, settings, worker) as answers:
        starting = functools.partial(
            _refusal_at_start, admitted.call, settings=settings, worker=worker
        )
        outcome = execute(
            admitted.call, worker=worker, definition=admitted.definition, starting=starting
        )
    return outcome if answers() else None


async def _run_in_tool_thread(
    admitted: Admitted, *, settings: Settings, worker: str, offload: Offload
) -> CallOutcome | None:
    """:func:`run_call`'s last steps for a ``def`` tool on the asyncio pool: run the tool
    and deliver its outcome in one of the pool's tool threads, as a prefork child does.

    The outcome leaves from the thread that ran the tool, so a call crosses no more
    threads than an ``async def`` tool's: handing it back to the loop and on to a delivery
    thread cost a sequential round trip about 0.2 ms (two thread wake-ups). Only a plain
    call that ends while other calls run goes back to the loop, to share one pipeline with
    theirs (:meth:`Offload.deliver_batched`). A call the pool gives up before a thread
    takes it (a cold shutdown) never starts, and its key is let go.
    """
    taken = threading.Lock()  # the thread that takes it, or the give-up: whichever is first

    def in_thread() -> tuple[CallOutcome | None, bool]:
        if not taken.acquire(blocking=False):
            return None, True  # given up before it started
        outcome = _run_here(admitted, settings=settings, worker=worker)
        if outcome is None or (admitted.call.idempotency_key is None and not offload.alone()):
            return outcome, False
        return conclude(admitted, outcome, settings=settings), True

    loop = asyncio.get_running_loop()
    try:
        outcome, delivered = await loop.run_in_executor(None, copy_context().run, in_thread)
    except asyncio.CancelledError:
        if taken.acquire(blocking=False):
            running_here.abandon(admitted)
        raise
    if outcome is None or delivered:
        return outcome
    return await offload.deliver_batched(_conclude_plain, (admitted, outcome, settings))


@contextmanager
def _running(admitted: Admitted, settings: Settings, worker: str) -> Iterator[Callable[[], bool]]:
    """Run the admitted call's tool in the block: counted, cancellable; its key let go if
    the block raises. Yields whether this delivery still answers the call (False once its
    cancel's grace answered it, :mod:`executor.cancels`: the tool's outcome is dropped)."""
    answered: list[bool] = []
    try:
        with (
            observe.running(admitted.call, worker=worker, settings=settings),
            cancels.watch(admitted, settings),
        ):
            yield lambda: answered[0]
            answered.append(cancel_state.take_answer(admitted.call.call_id))
    except BaseException:
        running_here.abandon(admitted)
        raise
    if not answered[0]:
        running_here.abandon(admitted)


def admit(
    fields: dict[str, Any], *, settings: Settings, worker: str, generation: int | None = None
) -> Admitted | CallOutcome | None:
    """The steps before a call runs: validate it, refuse it if expired, let a copy sent
    again ask whether it may start, begin it.

    Returns :class:`Admitted` when the tool must run in this delivery; otherwise what this
    delivery delivered: the refusal or the stored outcome, or None (a malformed message,
    a copy that may not start, or a call that joined the delivery already running it).
    """
    call = _validated(fields)
    if call is None:
        return None
    return _admit_call(
        call,
        refuse_if_expired(call, worker=worker),
        settings=settings,
        worker=worker,
        generation=generation,
    )


def _validated(fields: dict[str, Any]) -> CallRequest | None:
    """The call in a task's keyword arguments; None (logged) when they are not one."""
    try:
        return CallRequest.model_validate(fields)
    except pydantic.ValidationError as exc:
        # Nobody can be told: there is no valid reply address. Drop it, loudly.
        logger.error("dropped a malformed toolexec message: %d problems", exc.error_count())
        return None


def _refusal_at_start(call: CallRequest, *, settings: Settings, worker: str) -> CallOutcome | None:
    """The outcome refusing ``call`` as its tool is about to start: it was cancelled
    while it waited for a thread, its deadline passed, or its caller no longer waits
    (:mod:`executor.callers`); else None."""
    if cancel_state.heard(call.call_id):
        return cancel_state.cancelled_outcome(
            call, worker=worker, why="cancelled before it started"
        )
    refusal = refuse_if_expired(call, worker=worker)
    if refusal is not None:
        return refusal
    if not caller_waits(redis_client(settings), call, settings=settings):
        return shed(call, worker=worker, settings=settings)
    return refuse_if_expired(call, worker=worker)  # it may have passed while the verdict was out


def _admit_call(
    call: CallRequest,
    refusal: CallOutcome | None,
    *,
    settings: Settings,
    worker: str,
    generation: int | None = None,
    ask_caller: bool = True,
) -> Admitted | CallOutcome | None:
    """:func:`admit` for a valid call, given what the deadline check said of it.

    ``refusal`` is :func:`~executor.runner.refuse_if_expired`'s answer. A call whose
    caller no longer waits is shed (:mod:`executor.callers`: one look per caller a third of
    an interval). Otherwise it sends nothing to Redis for a plain call it let through
    (the worker's heartbeat records who runs a plain call once it has run for a moment,
    :class:`executor.worker.Heartbeat`), but on RabbitMQ, where a prefork child records
    who holds an at-most-once call before its tool starts
    (:func:`executor.claims.hold`).
    """
    tag = holder(worker)
    cancels.listen(settings)  # once per process, before its first call
    if refusal is None and cancel_state.heard(call.call_id):
        refusal = cancel_state.cancelled_outcome(
            call, worker=worker, why="cancelled before it started"
        )
    if (
        refusal is None
        and ask_caller
        and not caller_waits(redis_client(settings), call, settings=settings)
    ):
        refusal = shed(call, worker=worker, settings=settings)  # nobody waits for it: shed unrun
    if refusal is not None:
        finish(call, refusal, settings=settings, store=False, holder=tag)
        return refusal
    if generation is not None and not may_start(
        call, generation, tag=tag, settings=settings, worker=worker
    ):
        return None
    definition = get_tool(call.tool)
    if (
        definition is not None
        and definition.spec.delivery == "at_most_once"
        and in_pool_child()
        and holds_before_ack(settings, acks_late=False)
    ):
        hold(redis_client(settings), call.call_id, tag, interval=settings.heartbeat_interval)
    if call.handle:
        mark_running(call, worker=worker, settings=settings)
    if call.idempotency_key is None:
        open_progress(call, settings)  # report_progress() reaches the caller from now on
        return Admitted(call=call, definition=definition, holder=tag)
    client = redis_client(settings)
    ttl_ms = keys.call_ttl_ms(
        "running",
        deadline=call.deadline,
        settings=settings,
        hard_timeout=definition.spec.hard_timeout if definition is not None else None,
    )
    try:
        begun = _begin_patiently(
            client,
            call,
            call.idempotency_key,
            tag=tag,
            worker=worker,
            ttl_ms=ttl_ms,
            patience=settings.heartbeat_interval,
            replicas=settings.replica_acks,
        )
    except ReplicasBehind as behind:
        logger.warning("%s", behind, extra=call_log_fields(call.call_id, call.run_id, call.tool))
        refusal = CallOutcome.failure(
            call.call_id, ErrorKind.EXPIRED, "ReplicasBehind", str(behind), worker=worker
        )
        # Its state let go, its claim freed, its caller and joiners told: a retry runs it.
        finish(call, refusal, settings=settings, store=False, holder=behind.holder)
        return refusal
    if isinstance(begun, CallOutcome):
        finish(call, begun, settings=settings, store=False, holder=tag)
        return begun
    state, value, tag, key_lock = begun
    if state == "busy":
        logger.info(
            "call %s of %s joined the delivery already running it",
            call.call_id,
            call.tool,
            extra=call_log_fields(call.call_id, call.run_id, call.tool),
        )
        return None
    if state == "stored":
        logger.info(
            "call %s of %s answered from its stored outcome",
            call.call_id,
            call.tool,
            extra=call_log_fields(call.call_id, call.run_id, call.tool),
        )
        deliver_encoded(client, call, value, settings=settings, store=False, holder=tag)
        return CallOutcome.model_validate_json(value)
    open_progress(call, settings)  # report_progress() reaches the caller from now on
    return Admitted(call=call, definition=definition, holder=tag, key_lock=key_lock)


#: How long a worker keeps trying to begin an idempotent call while Redis is unreachable.
_BEGIN_PATIENCE = 10.0


def _begin_patiently(
    client: redis.Redis,
    call: CallRequest,
    key: str,
    *,
    tag: str,
    worker: str,
    ttl_ms: int,
    patience: float,
    replicas: int,
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
                client,
                call,
                key,
                tag=tag,
                worker=worker,
                ttl_ms=ttl_ms,
                patience=patience,
                replicas=replicas,
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
                    "could not begin call %s of %s (%s); trying again",
                    call.call_id,
                    call.tool,
                    type(exc).__name__,
                    extra=call_log_fields(call.call_id, call.run_id, call.tool),
                )
            time.sleep(pause)


def conclude(admitted: Admitted, outcome: CallOutcome, *, settings: Settings) -> CallOutcome:
    """Deliver the outcome of an admitted call, stored when its tool keeps outcomes; return it."""
    close_progress(admitted.call)  # its last progress report goes before the outcome
    spec = admitted.definition.spec if admitted.definition is not None else None
    store = should_store(spec, outcome)
    with running_here.completing(admitted):
        finish(admitted.call, outcome, settings=settings, store=store, holder=admitted.holder)
    return outcome


def _conclude_plain(
    concluded: list[tuple[Admitted, CallOutcome, Settings]],
) -> list[CallOutcome | BaseException]:
    """:func:`conclude` for many plain calls (no idempotency key) at once: one pipeline.

    What :func:`~executor.delivery.finish` does for each, with the outcome pushes of all
    the calls in one Redis round trip (:func:`~executor.delivery.push_plain`). Returns
    each call's outcome, or the exception that kept it from being delivered.
    """
    results: list[CallOutcome | BaseException] = []
    delivered: list[tuple[CallRequest, str, Settings]] = []
    for admitted, outcome, settings in concluded:
        call = admitted.call
        try:
            if call.idempotency_key is not None:
                raise ValueError(f"call {call.call_id} has an idempotency key: conclude it alone")
            close_progress(call)  # its last progress report goes before the outcome
            encoded = record_and_encode(call, outcome, settings=settings)
        except Exception as exc:  # noqa: BLE001 - this call's failure, not the others'
            results.append(exc)
            continue
        delivered.append((call, encoded, settings))
        results.append(outcome)
    push_plain(delivered)
    return results
