"""What the watchdog does with a call it finds lost: send a copy again, give it up, dead-letter it.

Both ways of acting on a lost call write its fence first (:mod:`wire.copies`), and do so
only if no worker has recorded the call held since the watchdog looked: a copy sent
again is the next generation, so no earlier copy starts once it is out; a call given up
is fenced for good, so no copy starts at all. A Redis that refuses the write (out of
memory) leaves the call as it was, to be looked at again next round.
"""

from __future__ import annotations

import logging

from agent_client._io.callstate import CallState
from agent_client._io.link import Link, NotSent, Refused, Unknown
from agent_client._io.loop import IOThread
from wire import keys
from wire.copies import GIVE_UP, PUSH_ONCE, RESEND, sent_again
from wire.deadletter import deadletter_commands, deadletter_entry
from wire.urls import is_amqp_url

logger = logging.getLogger(__name__)

#: Seconds one step's commands may take.
_TIMEOUT = 2.0


async def give_up(store: Link, call_id: str, state: CallState) -> bool:
    """Fence the call (no copy of it may start from now on), unless a worker has recorded
    it held since the last look; whether it was given up.

    Raises:
        NotSent: Redis did not take the fence (the call is looked at again next round).
    """
    seen = state.seen_holder or b""
    command = GIVE_UP.command(
        [keys.fence(call_id), keys.running(call_id)], [state.fence_ttl_ms, seen]
    )
    reply = (await store.execute([command], timeout=_TIMEOUT))[0]
    if isinstance(reply, Unknown | Refused):
        raise NotSent(f"could not give call {call_id} up: {reply.error}")
    if reply:
        return True
    state.absent_since = None  # held since the look: not lost
    return False


async def send_again(
    io: IOThread, store: Link, broker_url: str, call_id: str, state: CallState
) -> bool:
    """Send a lost at-least-once call again: its next generation, after the fence; whether sent.

    A joined call (no message of its own) claims again through the publisher; so does
    every call on RabbitMQ, which publishes the same message again.
    """
    if state.joined or is_amqp_url(broker_url):
        # No message of our own: claim again (or join, or get the stored outcome).
        # On RabbitMQ: publish again through the publisher (agent_client._io.amqp_lane).
        if state.resend is None:
            return False
        state.confirmed = False
        state.resend()
        return True
    # The next generation: the fence first (earlier copies may no longer start; not if a
    # worker has recorded the call held since the look), then the copy, pushed once
    # under its own sent marker.
    generation = state.resent + 1
    seen = state.seen_holder or b""
    fence = RESEND.command(
        [keys.fence(call_id), keys.running(call_id)], [generation, state.fence_ttl_ms, seen]
    )
    reply = (await store.execute([fence], timeout=_TIMEOUT))[0]
    if isinstance(reply, Unknown | Refused) or not reply:
        if not isinstance(reply, Unknown | Refused):
            state.absent_since = None  # held since: not lost
        return False
    copy = sent_again(state.envelope, generation)
    push = PUSH_ONCE.command(
        [state.queue, keys.sent_copy(call_id, generation)], [state.fence_ttl_ms, copy]
    )
    reply = (await io.link(broker_url, "read").execute([push], timeout=_TIMEOUT))[0]
    if isinstance(reply, Unknown | Refused):
        return False  # the fence names it: the next round pushes it, once
    state.pushed = copy
    return True


async def dead_letter(store: Link, call_id: str, state: CallState) -> None:
    """Dead-letter an at-least-once call given up after its workers died on every delivery."""
    entry = deadletter_entry(
        "worker_lost",
        queue=state.queue,
        payload=state.envelope,
        call_id=call_id,
        detail=f"its worker died on each of {state.resent + 1} deliveries (client watchdog)",
    )
    try:
        replies = await store.execute(deadletter_commands(entry), timeout=_TIMEOUT)
    except NotSent:
        replies = [None]
    if any(reply is None or isinstance(reply, Unknown | Refused) for reply in replies):
        logger.error("could not dead-letter lost call %s", call_id)
