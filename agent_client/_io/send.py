"""Send prepared calls to their broker: one batch at a time, and again until it answers.

Callers hand batches of :class:`~agent_client._io.callstate.Send` to the
:class:`Publisher` and return at once; the client's I/O thread
(:mod:`agent_client._io.loop`) routes each to a :class:`SendLane`, one per broker
URL: an idempotent call to the Redis of its claim, any other call (or an idempotent
one whose claim is made) to the broker. A lane's loop is the same for every broker;
what differs, how it connects and how one batch goes out and what each reply means,
is its :class:`BrokerLane`: :mod:`agent_client._io.redis_lane` (the push-once and
claim scripts), or :mod:`agent_client._io.amqp_lane` (kombu with publisher confirms,
imported only by a client of RabbitMQ).

A send whose fate is unknown (the connection failed after the write, or the broker
stalled past the write's timeout) is sent again once the broker answers: on Redis the
sent marker or the claim makes the second send a no-op if the first arrived. A send
that provably never went out (no connection) or that the broker refused (loading its
data, out of memory) is sent again too, with backoff. Only the caller's deadline ends
this: what the caller then hears depends on how far the send got
(:class:`~agent_client._io.callstate.CallState`).

**Unsent claims.** With a broker apart from Redis (RabbitMQ, or a second Redis), an
idempotent call is sent in two steps: the claim script claims its key in Redis without
pushing (:data:`wire.scripts.CLAIM`, ``push=0``), then the message is published to the
broker. When the publish never happens (the broker cannot be reached until the
caller's deadline, or the caller gave up), the claim would hold the key until its TTL:
every retry of the call in the run would join an execution that does not exist. So a
send a lane drops before any write of its message may have reached the broker releases
its claim (:data:`wire.scripts.RELEASE`: only if the claim still holds this call's id),
and its caller hears ``BrokerUnavailable``. A send whose publish may have reached the
broker (its fate unknown) keeps its claim: the message may run.

Async callers go through a :class:`LoopBatcher`, which gathers every call started in
one turn of their event loop and hands them over together at the end of that turn.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Protocol

from agent_client._io.callstate import Send, note, op_timeout
from agent_client._io.link import Link, NotSent, Refused, Unknown, backoff_after
from agent_client._io.loop import IOThread
from agent_client._io.redis_lane import RedisLane
from agent_client._io.runlog import RunLog
from wire import keys
from wire.resp import Arg
from wire.scripts import RELEASE
from wire.urls import is_amqp_url

logger = logging.getLogger(__name__)

#: Calls per batch at most.
_MAX_BATCH = 1000
#: Calls one event-loop turn gathers before it hands them to the I/O thread.
_TURN_CHUNK = 100
#: Seconds the release of unsent claims may take.
_RELEASE_TIMEOUT = 2.0

#: Releases under way (a task only weakly referenced by its loop may be collected).
_releasing: set[asyncio.Task[None]] = set()


class BrokerLane(Protocol):
    """What a :class:`SendLane` needs of its broker: the one part that differs by broker."""

    #: The broker's name in what the lane logs.
    broker: str

    async def connect(self, queued: Sequence[Send]) -> None:
        """Make sure a connection is up, writing nothing (within what ``queued`` have left).

        Raises:
            NotSent: No connection could be made.
        """

    async def send(self, batch: list[Send]) -> tuple[list[Send], bool]:
        """Send ``batch`` once; ``(sends to send again, whether to back off first)``.

        Never raises: a failure of its own counts as the batch's.
        """

    async def close(self) -> None:
        """Let go of the connection, once the lane has stopped."""


class Publisher:
    """Sends batches of :class:`Send` from the client's I/O thread, until their broker answers.

    Args:
        io: The client's I/O thread.
        broker_url: Where plain calls are pushed.
        store_url: Where idempotent calls are claimed (and pushed, when it is the broker).
        runlog: Where each call sent is logged (:mod:`agent_client._io.runlog`).
    """

    def __init__(self, io: IOThread, *, broker_url: str, store_url: str, runlog: RunLog) -> None:
        self._io = io
        self._runlog = runlog
        self._broker_url = broker_url
        self._store_url = store_url
        self._lanes: dict[str, SendLane] = {}
        #: The same lanes, replaced whole when one is added: read from callers' threads.
        self._every_lane: tuple[SendLane, ...] = ()

    def send(self, batch: list[Send]) -> None:
        """Hand ``batch`` to the I/O thread; returns at once, from any thread."""
        if batch:
            self._io.call_soon(self._accept, batch)

    def _accept(self, batch: list[Send]) -> None:
        # On the I/O thread: each send to the lane of its claim, or of its broker.
        for item in batch:
            claim = item.call.claim_ttl_ms is not None and not item.push_only
            self._lane(self._store_url if claim else self._broker_url).add([item])

    def _lane(self, url: str) -> SendLane:
        lane = self._lanes.get(url)
        if lane is None:
            if not self._lanes:
                self._io.on_close(self._close)
            broker: BrokerLane
            if is_amqp_url(url):
                # kombu: imported only by the clients of a RabbitMQ.
                from agent_client._io.amqp_lane import AmqpLane

                broker = AmqpLane(url)
            else:
                # A claim on the broker's own Redis pushes in the same script; one made
                # elsewhere comes back here, to be pushed on the broker's lane.
                broker = RedisLane(
                    self._io.link(url, "send"),
                    claims_push=self._store_url == self._broker_url,
                    forward=self._accept,
                )
            lane = self._lanes[url] = SendLane(
                self._io, url, broker, store_url=self._store_url, runlog=self._runlog
            )
            self._every_lane = (*self._every_lane, lane)
        return lane

    def stalled(self, *, longer_than: float) -> bool:
        """Whether a broker has kept a lane waiting longer than ``longer_than`` seconds, or
        failed its last batch (from any thread)."""
        return any(lane.stalled(longer_than=longer_than) for lane in self._every_lane)

    async def _close(self) -> None:
        lanes, self._lanes, self._every_lane = self._lanes, {}, ()
        for lane in lanes.values():
            await lane.stop()


class SendLane:
    """The sends to one broker: one batch at a time, everything queued meanwhile next.

    The loop is the same for every broker: connect before taking anything (a call that
    waited for a connection that never came was provably not sent), send a batch, put
    back what must be sent again, and back off while the broker cannot take calls.
    Its ``broker`` says how to connect and how to send a batch.

    Args:
        io: The client's I/O thread.
        url: The broker's URL.
        broker: How this lane reaches its broker.
        store_url: The Redis of the claims (released for a call never sent).
        runlog: Where each call the broker took is logged as sent.
    """

    def __init__(
        self, io: IOThread, url: str, broker: BrokerLane, *, store_url: str, runlog: RunLog
    ) -> None:
        self._io = io
        self._runlog = runlog
        self._url = url
        self._broker = broker
        self._store_url = store_url
        self._queue: collections.deque[Send] = collections.deque()
        self._wake = asyncio.Event()
        #: Since when (``time.monotonic()``) the lane has waited for the broker to take a
        #: batch or a connection, or None; read by callers whose deadline passes.
        self.waiting_since: float | None = None
        #: Whether the last batch or connection failed (the lane backs off).
        self.failing = False
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stalled(self, *, longer_than: float) -> bool:
        """Whether the broker has kept this lane waiting longer than ``longer_than``
        seconds, or failed it last (from any thread)."""
        since = self.waiting_since
        return self.failing or (since is not None and time.monotonic() - since > longer_than)

    def add(self, items: list[Send]) -> None:
        """Queue ``items`` for the next batch (on the I/O thread)."""
        self._queue.extend(items)
        self._wake.set()

    async def stop(self) -> None:
        """Stop sending; the claims of calls never sent are released, then the broker's
        connection let go of (on the I/O thread)."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self._release_on_stop()
        await self._broker.close()

    async def _run(self) -> None:
        backoff = 0.0
        where = _where(self._url)
        broker = self._broker.broker
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
            if backoff:
                await asyncio.sleep(backoff)
            self.waiting_since = time.monotonic()
            try:
                await self._broker.connect(self._queue)
            except NotSent as exc:
                self.waiting_since, self.failing = None, True
                note(self._queue, f"could not connect to {broker} at {where}: {exc}")
                if not backoff:
                    logger.warning(
                        "cannot connect to %s at %s; sending again until it answers", broker, where
                    )
                backoff = backoff_after(backoff)
                self._drop_gone()
                continue
            batch, unrecorded = await self._write_records(self._take())
            if not batch:
                self.waiting_since = None
                self._queue.extendleft(reversed(unrecorded))
                if unrecorded:
                    backoff = backoff_after(backoff)
                continue
            try:
                again, failed = await self._broker.send(batch)
            finally:
                self.waiting_since = None
            self._runlog.sent(batch)  # those the broker took, each once
            again += unrecorded
            self.failing = failed
            if failed and not backoff:
                logger.warning(
                    "%s at %s cannot take calls now; sending again until it does", broker, where
                )
            elif not failed and backoff:
                logger.info("%s at %s takes calls again", broker, where)
            self._queue.extendleft(reversed(again))
            backoff = backoff_after(backoff) if failed else 0.0

    async def _write_records(self, batch: list[Send]) -> tuple[list[Send], list[Send]]:
        """Write the records of the submitted calls of ``batch`` (wire.handles), before
        their messages go: ``(the sends ready to go, those whose record is not written)``."""
        waiting = [item for item in batch if item.record is not None]
        if not waiting:
            return batch, []
        commands: list[tuple[Arg, ...]] = []
        for item in waiting:
            name = keys.handle(item.call.request.call_id)
            assert item.record is not None
            commands.append(("HSET", name, *(x for pair in item.record.items() for x in pair)))
            commands.append(("PEXPIRE", name, item.record_ttl_ms))
        try:
            replies = await self._link().execute(commands, timeout=op_timeout(waiting))
        except NotSent:
            replies = [None] * len(commands)
        unwritten: set[int] = set()
        for index, item in enumerate(waiting):
            if any(
                r is None or isinstance(r, Refused | Unknown)
                for r in replies[2 * index : 2 * index + 2]
            ):
                unwritten.add(id(item))
                item.state.untake()
            else:
                item.record = None  # written: the message may go
        return [i for i in batch if id(i) not in unwritten], [
            i for i in batch if id(i) in unwritten
        ]

    def _drop_gone(self) -> None:
        # While the broker is away, the calls whose callers gave up leave the queue.
        now = time.monotonic()
        kept: list[Send] = []
        gone: list[Send] = []
        for item in self._queue:
            expired = item.expires_at is not None and now >= item.expires_at
            (gone if expired or item.state.abandoned else kept).append(item)
        self._queue = collections.deque(kept)
        self._release_unsent(gone)

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
        # A claimed call whose message never went out frees its claim.
        self._release_unsent(gone)
        return batch

    # -- unsent claims, released -------------------------------------------------------

    def _release_unsent(self, dropped: Iterable[Send]) -> None:
        # In the background, on the I/O thread: the dropped sends never published.
        claimed = unsent_claims(dropped)
        if not claimed:
            return
        task = asyncio.get_running_loop().create_task(self._release(self._link(), claimed))
        _releasing.add(task)
        task.add_done_callback(_releasing.discard)

    async def _release_on_stop(self) -> None:
        # The claims of the sends still queued, and every release under way on this loop
        # (bounded by the release's timeout).
        claimed = unsent_claims(self._queue)
        loop = asyncio.get_running_loop()
        waiting = [task for task in _releasing if task.get_loop() is loop]
        if claimed:
            waiting.append(loop.create_task(self._release(self._link(), claimed)))
        if waiting:
            await asyncio.wait(waiting, timeout=_RELEASE_TIMEOUT)

    def _link(self) -> Link:
        return self._io.link(self._store_url, "release")

    async def _release(self, link: Link, items: Sequence[Send]) -> None:
        commands: list[tuple[Arg, ...]] = []
        for item in items:
            key = item.call.request.idempotency_key
            assert key is not None
            commands.append(RELEASE.command([keys.claim(key)], [item.call.request.call_id]))
        try:
            replies = await link.execute(commands, timeout=_RELEASE_TIMEOUT)
        except NotSent as exc:
            logger.warning(
                "could not release %d unsent claims (%s); they expire with their TTL",
                len(items),
                exc,
            )
            return
        failed = sum(1 for r in replies if isinstance(r, Refused | Unknown))
        if failed:
            logger.warning("could not release %d unsent claims; they expire with their TTL", failed)


def unsent_claims(items: Iterable[Send]) -> list[Send]:
    """The sends among ``items`` that hold a claim and of which nothing was published."""
    return [
        item
        for item in items
        if item.push_only
        and item.call.request.idempotency_key is not None
        and not item.state.written
        and not item.state.confirmed
    ]


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
