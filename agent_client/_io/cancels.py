"""A call's cancel, and a submitted call's record, on the client's I/O thread.

**Cancel** (:func:`cancel_call`, for ``CallHandle.cancel``, ``toolexec cancel`` and a
caller that stopped waiting for an ``on_abandon="cancel"`` tool, :func:`abandoned`; its
steps are :func:`cancel`'s): in the Redis of the records, the call's entry in
``toolexec:cancelled`` (a worker that takes any copy of it does not run it), its fence
``x`` (no copy sent again starts, ``wire.copies``) and a message on
:data:`wire.keys.CANCELS`, which every worker process hears at once and which stops the
call where it runs; then, on a Redis broker, its copies are taken off their queue
(``LREM`` of each copy's exact text). A copy taken off is a call that never starts: its
caller is told so at once (the caller of :func:`cancel` settles its outcome). A call
already taken is ended by its worker: a queued one unrun, a running one once its tool
has unwound, or its grace has passed.

**A submitted call's record** (``wire.handles``): what a process attached to it reads
(:func:`read_record`), joins (:func:`join`) and, for an outcome the worker could not
give (lost, or cancelled off its queue), ends (:func:`end`).
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from agent_client._io.link import Link, NotSent, Refused, Unknown
from agent_client.errors import BrokerUnavailable
from wire import keys
from wire.clock import shared_now
from wire.copies import FENCED, sent_again
from wire.formats import waiter_entry
from wire.handles import END, ENDED, JOIN, status_of
from wire.models import CallOutcome, ErrorKind, ToolSpec
from wire.resp import Arg
from wire.urls import is_redis_url

if TYPE_CHECKING:
    from agent_client._io.callstate import CallState
    from agent_client._io.loop import IOThread
    from agent_client._io.replies import ReplyRouter
    from wire.settings import Settings

logger = logging.getLogger(__name__)

#: Seconds one step's commands may take.
TIMEOUT = 2.0


def copies_of(envelope: str, generations: int) -> list[str]:
    """The text of every copy of a call there may be in its queue: the first send, and
    each copy sent again up to ``generations`` (``wire.copies.sent_again``)."""
    return [envelope, *(sent_again(envelope, g) for g in range(generations + 1))]


async def cancel(
    store: Link,
    broker: Link | None,
    *,
    call_id: str,
    queue: str,
    copies: Sequence[str],
    ttl_ms: int,
) -> bool:
    """Cancel call ``call_id``; whether a copy of it was taken off its queue (it never starts).

    ``broker`` is None on RabbitMQ, whose queue cannot be searched: the workers' cancel
    alone stops the call there.

    Raises:
        NotSent: The cancel did not reach Redis (nothing was done).
    """
    now = shared_now()
    marks: list[tuple[Arg, ...]] = [
        ("ZADD", keys.CANCELLED, f"{now + ttl_ms / 1000:.3f}", call_id),
        ("ZREMRANGEBYSCORE", keys.CANCELLED, "-inf", f"{now:.3f}"),
        ("SET", keys.fence(call_id), FENCED, "PX", ttl_ms),
        ("PUBLISH", keys.CANCELS, call_id),
    ]
    replies = await store.execute(marks, timeout=TIMEOUT)
    failed = next((r for r in replies if isinstance(r, Refused | Unknown)), None)
    if failed is not None:
        raise NotSent(f"the cancel of call {call_id} did not reach Redis: {failed.error}")
    if broker is None or not copies:
        return False
    taken = await broker.execute([("LREM", queue, 0, copy) for copy in copies], timeout=TIMEOUT)
    return any(isinstance(n, int) and n > 0 for n in taken)


def broker_link(io: Any, broker_url: str) -> Link | None:
    """The link to take copies off a Redis broker's queues; None for RabbitMQ."""
    return io.link(broker_url, "read") if is_redis_url(broker_url) else None


async def end(
    store: Link, outcome: CallOutcome, *, handle_ttl: int, reply_ttl: int, tell_sender: bool
) -> bool:
    """End a submitted call's record with ``outcome`` and tell every process attached to
    it (and, with ``tell_sender``, the one that submitted it); whether this ended it."""
    call_id = outcome.call_id
    kind = outcome.error.kind.value if outcome.error is not None else None
    command = END.command(
        [keys.handle(call_id), keys.handle_waiters(call_id)],
        [
            status_of(outcome.ok, kind),
            outcome.model_dump_json(),
            f"{time.time():.3f}",
            handle_ttl * 1000,
            reply_ttl,
            keys.reply(""),
            "1" if tell_sender else "0",
        ],
    )
    (reply,) = await store.execute([command], timeout=TIMEOUT)
    if isinstance(reply, Refused | Unknown):
        raise NotSent(f"could not end the record of call {call_id}: {reply.error}")
    return bool(reply)


async def join(store: Link, *, call_id: str, client_id: str, ttl_ms: int) -> tuple[str, str]:
    """Attach to a submitted call: ``("unknown", "")``, ``("ended", outcome JSON)`` or
    ``("waiting", status)`` (its outcome's frame will come to ``client_id``'s reply list)."""
    command = JOIN.command(
        [keys.handle(call_id), keys.handle_waiters(call_id)],
        [waiter_entry(client_id, call_id), ttl_ms],
    )
    (reply,) = await store.execute([command], timeout=TIMEOUT)
    if isinstance(reply, Refused | Unknown):
        raise NotSent(f"could not attach to call {call_id}: {reply.error}")
    state, value = (v.decode() if isinstance(v, bytes) else str(v) for v in reply)
    return state, value


async def read_record(store: Link, call_id: str) -> dict[str, str]:
    """A submitted call's record as it is now (empty when nothing is kept)."""
    (reply,) = await store.execute([("HGETALL", keys.handle(call_id))], timeout=TIMEOUT)
    if isinstance(reply, Refused | Unknown):
        raise NotSent(f"could not read the record of call {call_id}: {reply.error}")
    if isinstance(reply, dict):
        items = list(reply.items())
    else:
        items = list(zip(reply[::2], reply[1::2], strict=True))
    return {_text(k): _text(v) for k, v in items}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- cancelling a call, and what its caller is told ---------------------------------


class Connection(Protocol):
    """What a cancel needs of the process's client (:class:`agent_client.client.ToolClient`):
    its settings, its I/O thread, and its reply router (to answer a plain call of its own)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def io(self) -> IOThread: ...

    @property
    def replies(self) -> ReplyRouter: ...


async def cancel_call(
    client: Connection, call_id: str, *, tool: str, queue: str, envelope: str, generations: int
) -> bool:
    """Cancel call ``call_id`` (on the I/O thread); False if it had ended already.

    A copy taken off its queue never starts: its waiters are told ``ToolCancelled`` here
    (the record's end pushes it to the sender and every attached process). A call a
    worker holds is ended by that worker.

    Raises:
        BrokerUnavailable: The cancel did not reach Redis.
    """
    settings = client.settings
    store = client.io.link(settings.redis_url, "read")
    try:
        record = await read_record(store, call_id)
        if record.get("status") in ENDED:
            return False
        queue = queue or record.get("queue", "")
        envelope = envelope or record.get("envelope", "")
        broker = broker_link(client.io, settings.broker_url)
        ttl_ms = max(settings.reply_ttl, settings.handle_ttl) * 1000
        taken = await cancel(
            store,
            broker,
            call_id=call_id,
            queue=queue,
            ttl_ms=ttl_ms,
            copies=copies_of(envelope, generations) if envelope else [],
        )
    except NotSent as exc:
        raise BrokerUnavailable(f"cannot cancel call {call_id}: {exc}", tool=tool) from None
    if taken:
        outcome = CallOutcome.failure(
            call_id,
            ErrorKind.CANCELLED,
            "ToolCancelled",
            "cancelled while queued: it never started",
        )
        ended = False
        if record:
            try:
                ended = await end(
                    store,
                    outcome,
                    handle_ttl=settings.handle_ttl,
                    reply_ttl=settings.reply_ttl,
                    tell_sender=True,
                )
            except NotSent:
                ended = False
        if not ended:
            client.replies.settle(call_id, outcome)  # a plain call of this process
    return True


def abandoned(client: Connection, call_id: str, spec: ToolSpec, state: CallState | None) -> None:
    """The caller stopped waiting for call ``call_id`` of ``spec`` (the tool's spec with
    the call's own ``on_abandon``): cancel it if that says so, in the background."""
    if state is None or spec.on_abandon != "cancel":
        return
    work = functools.partial(
        cancel_call,
        client,
        call_id,
        tool=spec.name,
        queue=spec.queue,
        envelope=state.pushed,
        generations=client.settings.max_deliveries,
    )
    client.io.submit(work).add_done_callback(_cancel_failed)


def _cancel_failed(done: concurrent.futures.Future[bool]) -> None:
    if not done.cancelled() and done.exception() is not None:
        logger.warning("could not cancel an abandoned call: %s", done.exception())
