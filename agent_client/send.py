"""Send prepared calls to Redis: one round trip per batch, and again until Redis answers.

A :class:`Send` is one prepared call and the future its outcome resolves. Callers hand
batches to the :class:`Publisher` and return at once; the client's I/O thread
(:mod:`agent_client.io`) writes them, one pipeline per batch and server:

* a plain call is pushed by :data:`PUSH_ONCE`, which pushes a call's message only if
  the call's *sent marker* (``toolexec:sent:<call id>``, set in the same atomic step)
  does not exist yet. Sending a call twice therefore queues it once;
* an idempotent call is the claim script (:data:`wire.scripts.CLAIM`, one run for
  every idempotent call of the batch): claim the key and push, or return the stored
  outcome, or join the execution under way.

So a send whose fate is unknown (the connection failed after the write, or Redis
stalled past the write's timeout) is simply sent again once Redis answers: the marker
or the claim makes the second send a no-op if the first arrived. A send that provably
never went out (no connection) or that Redis refused (loading its data, out of memory)
is sent again too, with backoff. Only the caller's deadline ends this: what the caller
then hears depends on how far the send got (:class:`~agent_client.callstate.CallState`).

Async callers go through a :class:`LoopBatcher`, which gathers every call started in
one turn of their event loop and hands them over together at the end of that turn.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from agent_client._futures import Waiter, settle_from_thread
from agent_client.brokers import is_amqp_url
from agent_client.callstate import CallState
from agent_client.errors import BrokerUnavailable
from agent_client.io import (
    Arg,
    IOThread,
    Link,
    NotSent,
    Refused,
    Unknown,
    backoff_after,
    is_transient,
)
from agent_client.prepare import PreparedCall
from agent_client.unsent import release_on_stop, release_unsent_claims
from wire import keys
from wire.formats import waiter_entry
from wire.models import CallOutcome
from wire.scripts import CLAIM, PUSH_ONCE, pairs

__all__ = ["LoopBatcher", "Publisher", "Send", "SendLane", "op_timeout"]

logger = logging.getLogger(__name__)

#: Seconds one pipeline may take before its fate counts as unknown and it is sent again.
_OP_TIMEOUT = 2.0
#: Calls per pipeline at most.
_MAX_BATCH = 1000
#: Calls one event-loop turn gathers before it hands them to the I/O thread.
_TURN_CHUNK = 100


@dataclass(kw_only=True, slots=True, eq=False)
class Send:
    """One call to send, the future its outcome resolves, and its state.

    Attributes:
        call: The prepared call.
        future: Resolved by the outcome (or an error).
        state: How far the send got; shared with the caller and the watchdog.
        expires_at: The caller's deadline (``time.monotonic()``), or None.
        push_only: Push the message even though the call is idempotent (its claim,
            on a Redis apart from the broker, is already made).
    """

    call: PreparedCall
    future: Waiter
    state: CallState
    expires_at: float | None = None
    push_only: bool = False


class Publisher:
    """Sends batches of :class:`Send` from the client's I/O thread, until Redis answers.

    Args:
        io: The client's I/O thread.
        broker_url: Where plain calls are pushed.
        store_url: Where idempotent calls are claimed (and pushed, when it is the broker).
    """

    def __init__(self, io: IOThread, *, broker_url: str, store_url: str) -> None:
        self._io = io
        self._broker_url = broker_url
        self._store_url = store_url
        self._lanes: dict[str, SendLane] = {}

    def send(self, batch: list[Send]) -> None:
        """Hand ``batch`` to the I/O thread; returns at once, from any thread."""
        if batch:
            self._io.call_soon(self._accept, batch)

    def _accept(self, batch: list[Send]) -> None:
        for item in batch:
            claim = item.call.claim_ttl_ms is not None and not item.push_only
            self._lane(self._store_url if claim else self._broker_url).add([item])

    def _lane(self, url: str) -> SendLane:
        lane = self._lanes.get(url)
        if lane is None:
            if not self._lanes:
                self._io.on_close(self._close)
            if is_amqp_url(url):
                from agent_client.amqp import AmqpLane  # kombu: only for clients of RabbitMQ

                lane = self._lanes[url] = AmqpLane(self._io, url, store_url=self._store_url)
            else:
                lane = self._lanes[url] = _Lane(self, url, self._io.link(url, "send"))
        return lane

    async def _close(self) -> None:
        lanes, self._lanes = self._lanes, {}
        for lane in lanes.values():
            await lane.stop()

    # -- one batch, on the I/O thread ----------------------------------------------------

    async def send_batch(self, link: Link, batch: list[Send]) -> tuple[list[Send], bool]:
        """Send ``batch`` once; ``(items to send again, whether to back off first)``."""
        push_claimed = self._store_url == self._broker_url
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
            commands.append(_claim_command(claims, push=push_claimed))
            spans.append((True, claims))
        for queue, items in plain.items():
            commands.append(_push_command(queue, items))
            spans.append((False, items))
        try:
            replies = await link.execute(commands, timeout=op_timeout(batch))
        except NotSent as exc:
            for item in batch:
                item.state.untake()
            _note(batch, f"could not connect to Redis: {exc}")
            return batch, True
        again: list[Send] = []
        back_off = False
        for (is_claim, items), reply in zip(spans, replies, strict=True):
            if isinstance(reply, Unknown):
                _note(items, f"the connection to Redis failed while sending: {_text(reply.error)}")
                again += items
                back_off = True
            elif isinstance(reply, Refused):
                retry = self._refused(items, reply)
                again += retry
                back_off |= bool(retry)
            elif is_claim:
                again += self._claimed(items, reply, pushed=push_claimed)
            else:
                for item in items:
                    item.state.confirm()
        return again, back_off

    @staticmethod
    def _refused(items: list[Send], reply: Refused) -> list[Send]:
        # Redis did not run it: send it again (returned), or fail it when it never can
        # run. A forgotten script was loaded and run again by the link (agent_client.io).
        if is_transient(reply):
            _note(items, f"Redis refused the call for now: {_text(reply.error)}")
            return items
        for item in items:
            tool = item.call.spec.name
            error = BrokerUnavailable(f"Redis refused the call to {tool!r}: {_text(reply.error)}", tool=tool)
            settle_from_thread([(item.future, None, error)])
        return []

    def _claimed(self, items: list[Send], reply: Any, *, pushed: bool) -> list[Send]:
        for item, (state, stored) in zip(items, pairs(reply), strict=True):
            if state == "stored":
                item.state.confirm()
                settle_from_thread([(item.future, CallOutcome.model_validate_json(stored), None)])
            elif state == "claimed" and not pushed:
                self._push_claimed([item])
            else:
                item.state.confirm(joined=state == "joined")
        return []

    def _push_claimed(self, items: list[Send]) -> None:
        # The claim is made on a Redis apart from the broker: push the message there.
        for item in items:
            item.push_only = True
            item.state.untake()  # only its claim is written: the call itself is not sent yet
        self._lane(self._broker_url).add(items)


class SendLane:
    """The sends to one broker: one batch at a time, everything queued meanwhile next.

    The loop is the same for every broker: connect before taking anything (a call that
    waited for a connection that never came was provably not sent), send a batch, put
    back what must be sent again, and back off while the broker cannot take calls.
    A subclass says how to connect (:meth:`_connect`, raising :class:`NotSent`) and how
    to send a batch (:meth:`_send`: the sends to try again, and whether to back off).

    Args:
        io: The client's I/O thread.
        url: The broker's URL.
        store_url: The Redis of the claims (released for a call never sent).
    """

    #: The broker's name in what the lane logs.
    broker = "Redis"

    def __init__(self, io: IOThread, url: str, *, store_url: str) -> None:
        self._io = io
        self._url = url
        self._store_url = store_url
        self._queue: collections.deque[Send] = collections.deque()
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def add(self, items: list[Send]) -> None:
        """Queue ``items`` for the next batch (on the I/O thread)."""
        self._queue.extend(items)
        self._wake.set()

    async def stop(self) -> None:
        """Stop sending; the claims of calls never sent are released (on the I/O thread)."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await release_on_stop(self._io, self._store_url, self._queue)

    async def _connect(self) -> None:
        raise NotImplementedError

    async def _send(self, batch: list[Send]) -> tuple[list[Send], bool]:
        raise NotImplementedError

    async def _run(self) -> None:
        backoff = 0.0
        where = _where(self._url)
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
            if backoff:
                await asyncio.sleep(backoff)
            try:
                await self._connect()
            except NotSent as exc:
                _note(self._queue, f"could not connect to {self.broker} at {where}: {exc}")
                if not backoff:
                    logger.warning("cannot connect to %s at %s; sending again until it answers", self.broker, where)
                backoff = backoff_after(backoff)
                self._drop_gone()
                continue
            batch = self._take()
            if not batch:
                continue
            again, failed = await self._send(batch)
            if failed and not backoff:
                logger.warning("%s at %s cannot take calls now; sending again until it does", self.broker, where)
            elif not failed and backoff:
                logger.info("%s at %s takes calls again", self.broker, where)
            self._queue.extendleft(reversed(again))
            backoff = backoff_after(backoff) if failed else 0.0

    def _drop_gone(self) -> None:
        # While the broker is away, the calls whose callers gave up leave the queue.
        now = time.monotonic()
        kept: list[Send] = []
        gone: list[Send] = []
        for item in self._queue:
            expired = item.expires_at is not None and now >= item.expires_at
            (gone if expired or item.state.abandoned else kept).append(item)
        self._queue = collections.deque(kept)
        release_unsent_claims(self._io, self._store_url, gone)

    def _take(self) -> list[Send]:
        now = time.monotonic()
        batch: list[Send] = []
        gone: list[Send] = []
        while self._queue and len(batch) < _MAX_BATCH:
            item = self._queue.popleft()
            if item.expires_at is not None and now >= item.expires_at:
                gone.append(item)  # its caller is gone: the deadline passed
            elif item.state.take():
                batch.append(item)
            else:
                gone.append(item)
        # A claimed call whose message never went out frees its claim (agent_client.unsent).
        release_unsent_claims(self._io, self._store_url, gone)
        return batch


class _Lane(SendLane):
    """The sends to one Redis server, over one :class:`Link`."""

    def __init__(self, publisher: Publisher, url: str, link: Link) -> None:
        self._publisher = publisher
        self._link = link
        super().__init__(publisher._io, url, store_url=publisher._store_url)

    async def _connect(self) -> None:
        await self._link.connect(timeout=_OP_TIMEOUT)

    async def _send(self, batch: list[Send]) -> tuple[list[Send], bool]:
        try:
            return await self._publisher.send_batch(self._link, batch)
        except Exception as exc:  # noqa: BLE001 - a bug must not stop every later send
            logger.error("sending a batch of %d calls failed: %s", len(batch), type(exc).__name__)
            return batch, True


def _claim_command(items: list[Send], *, push: bool) -> tuple[Arg, ...]:
    names: list[str] = []
    arguments: list[Arg] = []
    for item in items:
        call = item.call
        key = call.idempotency_key
        assert key is not None and call.claim_ttl_ms is not None
        names += [keys.claim(key), keys.state(key), keys.waiters(key), call.spec.queue]
        arguments += [
            call.call_id, call.claim_ttl_ms, call.envelope,
            waiter_entry(call.request.reply_to, call.call_id), "1" if push else "0",
        ]  # fmt: skip
    return CLAIM.command(names, arguments)


def _push_command(queue: str, items: list[Send]) -> tuple[Arg, ...]:
    names = [queue]
    arguments: list[Arg] = []
    for item in items:
        names.append(keys.sent(item.call.call_id))
        arguments += [item.call.sent_ttl_ms, item.call.envelope]
    return PUSH_ONCE.command(names, arguments)


def op_timeout(items: Iterable[Send]) -> float:
    """How long one operation for ``items`` may take: bounded by the time their callers
    have left (past that, nobody waits for the answer), at most ``_OP_TIMEOUT``."""
    now = time.monotonic()
    left = max(
        ((_OP_TIMEOUT if i.expires_at is None else i.expires_at - now) for i in items),
        default=_OP_TIMEOUT,
    )
    return min(_OP_TIMEOUT, max(0.05, left))


def _note(items: Iterable[Send], why: str) -> None:
    for item in items:
        item.state.last_error = why


def _text(error: BaseException) -> str:
    return str(error) or type(error).__name__


def _where(url: str) -> str:
    # Host and port only: a URL may carry a password.
    return url.rsplit("@", 1)[-1]


class LoopBatcher:
    """Collects the sends of one event-loop turn and hands them over at its end.

    It holds its loop weakly, so a closed loop and everything of it can be freed.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, publisher: Publisher) -> None:
        self._loop = weakref.ref(loop)
        self._publisher = publisher
        self._pending: list[Send] = []

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop whose turns this batcher gathers."""
        loop = self._loop()
        if loop is None:
            raise RuntimeError("the event loop of this batcher is gone")
        return loop

    def add(self, item: Send) -> None:
        """Queue ``item``; the batch goes out once the current loop turn's work is done.

        A turn that starts many calls hands them over every :data:`_TURN_CHUNK` calls,
        so the first reach Redis (and a worker) while the rest are still prepared.
        """
        if not self._pending:
            self.loop.call_soon(self._flush)
        self._pending.append(item)
        if len(self._pending) >= _TURN_CHUNK:
            self._flush()  # a flush scheduled for a chunk handed over so finds nothing

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        self._publisher.send(batch)
