"""Make a handle: send a call with a record (:func:`submit`), or find one (:func:`attach`).

See :mod:`agent_client.handles` for what a handle does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import TYPE_CHECKING, Any

from agent_client._io import cancels
from agent_client._io.callstate import SEND_STALL
from agent_client._io.link import NotSent
from agent_client.abandon import OnAbandon
from agent_client.errors import BrokerUnavailable, RemoteToolError, ToolTimeoutError, deadline_error
from agent_client.handles import CallHandle, CallNotFound, held
from agent_client.progress import ProgressCallback, ProgressSink
from wire.formats import waiter_entry
from wire.models import CallOutcome, ToolSpec

if TYPE_CHECKING:
    from agent_client.client import ToolClient
    from agent_client.prepare import PreparedCall

__all__ = ["SUBMIT_PATIENCE", "attach", "submit", "submit_async"]


#: How long a submit without a deadline waits for Redis (or RabbitMQ) to confirm its call.
SUBMIT_PATIENCE = 30.0


def submit(
    client: ToolClient,
    spec: ToolSpec,
    arguments: dict[str, Any],
    *,
    timeout: float | None,
    started: float | None = None,
    run_id: str | None = None,
    idempotency_key: str | None = None,
    on_progress: ProgressCallback | None = None,
    on_abandon: OnAbandon | None = None,
) -> CallHandle:
    """Send a call with a record; return its handle once both are durably queued
    (``RemoteTool.submit``).

    Raises:
        BrokerUnavailable: Nothing of the call was confirmed by its deadline (or within
            :data:`SUBMIT_PATIENCE` without one), and it provably was not sent.
        ToolOutcomeUnknown: A write of it may have reached Redis, unconfirmed.
        ToolTimeoutError: Redis answered, but the deadline was shorter than the way there.
    """
    handle, queued, patience = _send(
        client,
        spec,
        arguments,
        timeout=timeout,
        started=started,
        run_id=run_id,
        idempotency_key=idempotency_key,
        on_progress=on_progress,
        on_abandon=on_abandon,
    )
    try:
        queued.result(patience)
    except concurrent.futures.TimeoutError:
        error = _not_queued(client, handle, patience)
        if error is not None:
            raise error from None
    return handle


async def submit_async(
    client: ToolClient,
    spec: ToolSpec,
    arguments: dict[str, Any],
    *,
    timeout: float | None,
    started: float | None = None,
    run_id: str | None = None,
    idempotency_key: str | None = None,
    on_progress: ProgressCallback | None = None,
    on_abandon: OnAbandon | None = None,
) -> CallHandle:
    """:func:`submit` that awaits the confirmation without blocking the event loop."""
    handle, queued, patience = _send(
        client,
        spec,
        arguments,
        timeout=timeout,
        started=started,
        run_id=run_id,
        idempotency_key=idempotency_key,
        on_progress=on_progress,
        on_abandon=on_abandon,
    )
    # Shielded: the confirmation's future is the I/O thread's, and a wait that ends must
    # not cancel it.
    done, _ = await asyncio.wait({asyncio.shield(asyncio.wrap_future(queued))}, timeout=patience)
    error = None if done else _not_queued(client, handle, patience)
    if error is not None:
        raise error
    return handle


def _not_queued(client: ToolClient, handle: CallHandle, patience: float) -> RemoteToolError | None:
    """The error of a submit not confirmed within ``patience`` (the call is given up, as
    ``invoke`` gives one up at its deadline: :func:`~agent_client.errors.deadline_error`),
    or None when the confirmation came as the wait ended (the call is queued after all)."""
    state = handle._state
    if state is None or state.queued.done():
        return None
    sent = state.abandon()
    if sent[0]:
        return None  # confirmed in the instant between the two looks
    client.replies.forget(handle.id)
    held(client).pop(handle.id, None)
    return deadline_error(
        handle.tool,
        ToolTimeoutError(handle.tool, patience),
        sent,
        stalled=client.publisher.stalled(longer_than=SEND_STALL),
        call_id=handle.id,
    )


def _send(
    client: ToolClient,
    spec: ToolSpec,
    arguments: dict[str, Any],
    *,
    timeout: float | None,
    started: float | None,
    run_id: str | None,
    idempotency_key: str | None,
    on_progress: ProgressCallback | None,
    on_abandon: OnAbandon | None,
) -> tuple[CallHandle, concurrent.futures.Future[None], float]:
    """Hand a call with a record to the I/O thread: its handle, the future its first
    confirmation resolves, and how long to wait for it."""
    from agent_client.client import _joined_an_expired_call
    from agent_client.deadline import time_left

    left = time_left(timeout, started)
    call = client.prepare(
        spec,
        arguments,
        timeout=left,
        run_id=run_id,
        idempotency_key=idempotency_key,
        handle=True,
        on_abandon=on_abandon,
    )
    handle = CallHandle(
        client,
        call_id=call.call_id,
        tool=spec.name,
        queue=call.spec.queue,
        envelope=call.envelope,
        deadline=call.request.deadline,
        timeout=timeout,
        spec=call.spec,
    )
    handle._on_progress = on_progress
    sink = ProgressSink(handle._progress, None)
    handle._sink = sink
    record = {
        "tool": call.spec.name,
        "queue": call.spec.queue,
        "envelope": call.envelope,
        "status": "queued",
        "deadline": "" if call.request.deadline is None else repr(call.request.deadline),
        "sender": waiter_entry(client.client_id, call.call_id),
        "run_id": call.request.run_id or "",
        "timeout": "" if timeout is None else repr(timeout),
        "submitted_at": f"{time.time():.3f}",
    }

    def attempt(prepared: PreparedCall, record: dict[str, str] | None) -> None:
        left_now = handle._left()
        future, state = client._send(
            prepared, timeout=left_now, batcher=None, progress=sink, record=record
        )
        with handle._lock:
            handle._call, handle._state = prepared, state

        def arrived(done: concurrent.futures.Future[CallOutcome]) -> None:
            if done.cancelled() or done.exception() is not None:
                return
            outcome = done.result()
            if _joined_an_expired_call(prepared, outcome) and not handle._deadline_passed():
                # It joined a call that expired unrun: nothing ran, claim it again.
                again = client.prepare(
                    spec,
                    arguments,
                    timeout=handle._left(),
                    run_id=call.request.run_id,
                    idempotency_key=idempotency_key,
                    on_abandon=on_abandon,
                )
                attempt(again, None)
                return
            handle._ended(outcome)

        future.add_done_callback(arrived)  # type: ignore[arg-type]

    held(client)[call.call_id] = handle
    attempt(call, record)
    state = handle._state
    assert state is not None  # a submitted call is always sent (ToolClient._send)
    if left is not None:
        client.io.call_soon(lambda: client.io.loop.call_later(max(0.0, left), handle._expire))
    return handle, state.queued, SUBMIT_PATIENCE if left is None else max(0.0, left)


def attach(call_id: str, *, client: ToolClient | None = None) -> CallHandle:
    """The handle of a call that any process submitted, also one whose sender died.

    Raises:
        CallNotFound: No such call is kept (never submitted, or its record expired).
        BrokerUnavailable: Redis did not answer.
    """
    from agent_client.client import get_client

    client = client or get_client()
    mine = held(client).get(call_id)
    if mine is not None:
        return mine  # this process holds it already: one waiter per call id
    future = client.replies.expect(call_id)
    try:
        record, (state, value) = client.io.run(
            lambda: join_record(client, call_id), timeout=2 * cancels.TIMEOUT + 1
        )
    except BaseException:
        client.replies.forget(call_id)
        raise
    if state == "unknown":
        client.replies.forget(call_id)
        raise CallNotFound(call_id)
    deadline = float(record["deadline"]) if record.get("deadline") else None
    timeout = float(record["timeout"]) if record.get("timeout") else None
    handle = CallHandle(
        client,
        call_id=call_id,
        tool=record.get("tool", ""),
        queue=record.get("queue", ""),
        envelope=record.get("envelope", ""),
        deadline=deadline,
        timeout=timeout,
    )
    held(client)[call_id] = handle
    if state == "ended":
        client.replies.forget(call_id)
        handle._ended(CallOutcome.model_validate_json(value))
        return handle

    def arrived(done: concurrent.futures.Future[CallOutcome]) -> None:
        if not done.cancelled() and done.exception() is None:
            handle._ended(done.result())

    future.add_done_callback(arrived)  # type: ignore[arg-type]
    left = handle._left()
    if left is not None:

        def expire() -> None:
            client.replies.forget(call_id)
            handle._expire()

        client.io.call_soon(lambda: client.io.loop.call_later(max(0.0, left), expire))
    return handle


async def join_record(client: ToolClient, call_id: str) -> tuple[dict[str, str], tuple[str, str]]:
    settings = client.settings
    store = client.io.link(settings.redis_url, "read")
    try:
        record = await cancels.read_record(store, call_id)
        joined = await cancels.join(
            store, call_id=call_id, client_id=client.client_id, ttl_ms=settings.handle_ttl * 1000
        )
    except NotSent as exc:
        raise BrokerUnavailable(f"cannot attach to call {call_id}: {exc}", tool="") from None
    return record, joined
