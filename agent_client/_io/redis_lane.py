"""The Redis lane: a batch of sends as one pipeline of scripts, and what each reply means.

A :class:`RedisLane` is the Redis half of a :class:`~agent_client._io.send.SendLane`,
over one :class:`~agent_client._io.link.Link`. One batch is one pipeline:

* a plain call is pushed by :data:`~wire.scripts.PUSH_ONCE`, which pushes a call's
  message only if the call's *sent marker* (``toolexec:sent:<call id>``, set in the same
  atomic step) does not exist yet. Sending a call twice therefore queues it once;
* an idempotent call is the claim script (:data:`wire.scripts.CLAIM`, one run for
  every idempotent call of the batch): claim the key and push, or return the stored
  outcome, or join the execution under way. When the claim is made on a Redis apart
  from the broker, the script only claims, and the call goes back to its publisher to
  be pushed on the broker's lane.

So a send whose fate is unknown is simply sent again once Redis answers: the marker or
the claim makes the second send a no-op if the first arrived. A command Redis refused
for now (loading its data, out of memory) is sent again; one it can never run fails its
call with ``BrokerUnavailable``. A script Redis forgot was loaded and run again by the
link.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from agent_client._io.callstate import OP_TIMEOUT, SEND_STALL, Send, note, op_timeout
from agent_client._io.link import Link, NotSent, Refused, Unknown, is_transient
from agent_client._io.loop import settle_from_thread
from agent_client.errors import BrokerUnavailable
from wire import keys
from wire.copies import PUSH_ONCE
from wire.formats import waiter_entry
from wire.models import CallOutcome
from wire.resp import Arg
from wire.scripts import CLAIM, pairs

logger = logging.getLogger(__name__)


class RedisLane:
    """The sends to one Redis server, over one :class:`Link`.

    Args:
        link: The lane's connection.
        claims_push: Whether a claim pushes its message in the same script (the
            claims' Redis is the broker).
        forward: Takes back the calls claimed here to be pushed on the broker's lane.
    """

    broker = "Redis"

    def __init__(
        self, link: Link, *, claims_push: bool, forward: Callable[[list[Send]], None]
    ) -> None:
        self._link = link
        self._claims_push = claims_push
        self._forward = forward

    async def connect(self, queued: Sequence[Send]) -> None:
        """Make sure the connection is up (raises ``NotSent``)."""
        await self._link.connect(timeout=OP_TIMEOUT)

    async def close(self) -> None:
        """Nothing to do: the I/O thread closes its links."""

    async def send(self, batch: list[Send]) -> tuple[list[Send], bool]:
        """Send ``batch`` once; ``(sends to send again, whether to back off first)``."""
        try:
            return await self._send(batch)
        except Exception as exc:  # noqa: BLE001 - a bug must not stop every later send
            logger.error("sending a batch of %d calls failed: %s", len(batch), type(exc).__name__)
            return batch, True

    async def _send(self, batch: list[Send]) -> tuple[list[Send], bool]:
        commands: list[tuple[Arg, ...]] = []
        spans: list[tuple[bool, list[Send]]] = []
        plain: dict[str, list[Send]] = {}
        claims: list[Send] = []
        for item in batch:
            if item.call.claim_ttl_ms is not None and not item.push_only:
                claims.append(item)
            else:
                plain.setdefault(item.call.spec.queue, []).append(item)
        if claims:  # one script for them all, in order (wire.scripts.CLAIM)
            commands.append(_claim_command(claims, push=self._claims_push))
            spans.append((True, claims))
        for queue, items in plain.items():
            commands.append(_push_command(queue, items))
            spans.append((False, items))
        limit = op_timeout(batch)
        try:
            replies = await self._link.execute(commands, timeout=limit)
        except NotSent as exc:
            for item in batch:
                item.state.untake()
            note(batch, f"could not connect to Redis: {exc}")
            return batch, True
        again: list[Send] = []
        back_off = False
        for (is_claim, items), reply in zip(spans, replies, strict=True):
            if isinstance(reply, Unknown):
                again += items
                if isinstance(reply.error, TimeoutError) and limit < SEND_STALL:
                    # Its callers' deadlines cut the wait short: Redis was not given the
                    # time to answer, so this says nothing of it (the calls timed out).
                    continue
                note(items, f"the connection to Redis failed while sending: {_text(reply.error)}")
                back_off = True
            elif isinstance(reply, Refused):
                retry = _refused(items, reply)
                again += retry
                back_off |= bool(retry)
            elif is_claim:
                self._claimed(items, reply)
            else:
                for item in items:
                    item.state.confirm()
        return again, back_off

    def _claimed(self, items: list[Send], reply: Any) -> None:
        for item, (state, stored) in zip(items, pairs(reply), strict=True):
            if state == "stored":
                item.state.stored = True
                item.state.confirm()
                settle_from_thread([(item.future, CallOutcome.model_validate_json(stored), None)])
            elif state == "claimed" and not self._claims_push:
                self._push_claimed([item])
            else:
                item.state.confirm(joined=state == "joined")

    def _push_claimed(self, items: list[Send]) -> None:
        # The claim is made on a Redis apart from the broker: push the message there.
        for item in items:
            item.push_only = True
            item.state.untake()  # only its claim is written: the call itself is not sent yet
        self._forward(items)


def _refused(items: list[Send], reply: Refused) -> list[Send]:
    # Redis did not run it: send it again (returned), or fail it when it never can
    # run. A forgotten script was loaded and run again by the link.
    if is_transient(reply):
        note(items, f"Redis refused the call for now: {_text(reply.error)}")
        return items
    for item in items:
        tool = item.call.spec.name
        error = BrokerUnavailable(
            f"Redis refused the call to {tool!r}: {_text(reply.error)}", tool=tool
        )
        settle_from_thread([(item.future, None, error)])
    return []


def _claim_command(items: list[Send], *, push: bool) -> tuple[Arg, ...]:
    names: list[str] = []
    arguments: list[Arg] = []
    for item in items:
        call = item.call
        key = call.request.idempotency_key
        assert key is not None and call.claim_ttl_ms is not None
        names += [keys.claim(key), keys.state(key), keys.waiters(key), call.spec.queue]
        arguments += [
            call.request.call_id,
            call.claim_ttl_ms,
            call.envelope,
            waiter_entry(call.request.reply_to, call.request.call_id),
            "1" if push else "0",
        ]
    return CLAIM.command(names, arguments)


def _push_command(queue: str, items: list[Send]) -> tuple[Arg, ...]:
    names = [queue]
    arguments: list[Arg] = []
    for item in items:
        names.append(keys.sent(item.call.request.call_id))
        arguments += [item.call.sent_ttl_ms, item.call.envelope]
    return PUSH_ONCE.command(names, arguments)


def _text(error: BaseException) -> str:
    return str(error) or type(error).__name__
