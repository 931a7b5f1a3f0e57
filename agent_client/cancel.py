"""Cancel a call from this process (``CallHandle.cancel``, ``toolexec cancel``, a caller that
stopped waiting for an ``on_abandon="cancel"`` tool): the steps are
:func:`agent_client._io.cancels.cancel`'s; this is what the caller is told."""

from __future__ import annotations

import concurrent.futures
import functools
import logging
from typing import TYPE_CHECKING, Protocol

from agent_client._io import cancels
from agent_client._io.link import NotSent
from agent_client.errors import BrokerUnavailable
from wire.handles import ENDED
from wire.models import CallOutcome, ErrorKind

if TYPE_CHECKING:
    from agent_client._io.callstate import CallState
    from agent_client._io.loop import IOThread
    from agent_client._io.replies import ReplyRouter
    from agent_client.prepare import PreparedCall
    from wire.settings import Settings

__all__ = ["Connection", "abandoned", "cancel_call"]


class Connection(Protocol):
    """What a cancel needs of the process's client (:class:`agent_client.client.ToolClient`):
    its settings, its I/O thread, and its reply router (to answer a plain call of its own)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def io(self) -> IOThread: ...

    @property
    def replies(self) -> ReplyRouter: ...


logger = logging.getLogger(__name__)


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
        record = await cancels.read_record(store, call_id)
        if record.get("status") in ENDED:
            return False
        queue = queue or record.get("queue", "")
        envelope = envelope or record.get("envelope", "")
        broker = cancels.broker_link(client.io, settings.broker_url)
        ttl_ms = max(settings.reply_ttl, settings.handle_ttl) * 1000
        taken = await cancels.cancel(
            store,
            broker,
            call_id=call_id,
            queue=queue,
            ttl_ms=ttl_ms,
            copies=cancels.copies_of(envelope, generations) if envelope else [],
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
                ended = await cancels.end(
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


def abandoned(client: Connection, call: PreparedCall, state: CallState | None) -> None:
    """The caller stopped waiting for ``call``: cancel it if its tool says so
    (``@tool(on_abandon="cancel")``), in the background."""
    if state is None or call.spec.on_abandon != "cancel":
        return
    work = functools.partial(
        cancel_call,
        client,
        call.call_id,
        tool=call.spec.name,
        queue=call.spec.queue,
        envelope=state.pushed,
        generations=client.settings.max_deliveries,
    )
    client.io.submit(work).add_done_callback(_cancel_failed)


def _cancel_failed(done: concurrent.futures.Future[bool]) -> None:
    if not done.cancelled() and done.exception() is not None:
        logger.warning("could not cancel an abandoned call: %s", done.exception())
