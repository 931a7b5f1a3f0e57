"""The asyncio pool reads its queues itself, on its event loop: one thread fewer per call.

On every other pool, Celery's consumer reads the queues in the worker's main thread
(kombu's hub: ``BLMPOP`` sent, the socket polled, the reply parsed, each message handed to
Celery's strategy), and the asyncio pool's loop is then woken to run each call: every call
crossed from the main thread to the loop, and on a 2-core machine a thread wake-up is a
large share of a call made one at a time. With a Redis broker (a server or a Sentinel
group; not with kombu's ack emulation, a ``global_keyprefix`` or Celery's
``worker_disable_prefetch``), :class:`LoopReader` reads instead, on the pool's loop, and
hands each read to the channel of Celery's task consumer (``toolexec_deliver_read``,
:mod:`executor.seams.transport`), which delivers its messages exactly as it delivers
those of its own reads: refused items dead-lettered, each message through Celery's
strategy and request, its acknowledgement, its put-back, the heartbeat naming the messages
not yet handed over. The request then reaches the pool on the loop thread, where it
starts at once. ``TOOLEXEC_LOOP_READS=off`` leaves the reading to Celery's consumer.

**How many.** A read (``BLMPOP ... RIGHT COUNT n``) takes at most the pool's free slots,
and at most :data:`MAX_READ`: the worker never holds more calls than it can run.
No read is sent while no slot is free; a call that ends frees one and wakes the reader.
A server that refuses ``BLMPOP`` is read with ``BRPOP`` (one message) from then on.

**Attached to one channel at a time.** The consumer's bootstep (:mod:`executor.seams.loop_reads`)
attaches the reader to its task channel as it starts, and detaches it before that channel
closes: when the consumer stops, and when its connection breaks, before Celery puts back
the messages the channel holds unacknowledged. :meth:`LoopReader.detach` returns only once
no read is being handed over, so the channel never receives a message while it puts
messages back. A read that returns after its channel was detached is put back on its
queue, each item once (the channel's ``toolexec_put_back_unread``). Detaching ends the
read under way: each read also blocks on a list of the reader's own
(:func:`wire.keys.read_wake`, after the queues), and detaching pushes a token there, which
the read pops instead of waiting out its block (not ``CLIENT UNBLOCK``, which the
documented ACL user may not send: it reaches other connections). Where the push fails,
the read ends within :data:`READ_BLOCK`.

**Redis away.** A read that fails (the connection broke, or Redis froze past
:data:`SOCKET_TIMEOUT`) is sent again after a pause of 50 ms doubling to 1 s
(:func:`executor.worker.retry_pauses`, without an end); a read whose reply was lost as
the connection broke loses its messages unrecorded, as kombu's own read does, and the
client's watchdog notices them neither queued nor held (docs/guarantees.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from executor.worker import retry_pauses
from wire import keys
from wire.connect import async_pool, sync_client

__all__ = [
    "MAX_READ",
    "READ_BLOCK",
    "SOCKET_TIMEOUT",
    "LoopReader",
    "ReadChannel",
]

logger = logging.getLogger(__name__)

#: Most messages one read takes, the loop's and Celery's channel's own alike
#: (``executor.seams.transport.BATCH_MAX``): a read whose reply is lost as the connection
#: breaks loses no more.
MAX_READ = 100
#: Seconds one read blocks on empty queues before it is sent again (``BLMPOP``'s timeout).
READ_BLOCK = 1.0
#: Seconds the reader's connection waits for a reply beyond the block: a Redis that
#: froze (``SIGSTOP``, a long ``DEBUG SLEEP``) breaks the read after this long.
SOCKET_TIMEOUT = READ_BLOCK + 5.0
#: Seconds :meth:`LoopReader.detach` waits for a read under way to end when the server
#: did not unblock it.
DETACH_PATIENCE = SOCKET_TIMEOUT + 1.0


class ReadChannel(Protocol):
    """What the reader needs of Celery's task channel (``executor.seams.transport.Channel``)."""

    def toolexec_read_lists(self) -> list[str]:
        """The lists to read, in the order of the channel's fair queue cycle; [] for none."""
        ...

    def toolexec_deliver_read(self, popped_from: str, items: Sequence[bytes]) -> None:
        """Deliver the items one read popped from the list ``popped_from``."""
        ...

    def toolexec_put_back_unread(self, items: Sequence[bytes], popped_from: str) -> None:
        """Put items a read popped and never delivered back on their list, each once."""
        ...


class LoopReader:
    """Reads the queues of the channel it is attached to, on the pool's event loop.

    Args:
        url: The broker's URL (a server's, or a ``sentinel://`` URL).
        master: The group's name, for a ``sentinel://`` URL.
        room: How many calls the pool can take now (0 while it closes); read on the loop.
        block: Seconds one read blocks on empty queues (:data:`READ_BLOCK`).
    """

    def __init__(
        self,
        url: str,
        *,
        master: str | None,
        room: Callable[[], int],
        block: float = READ_BLOCK,
    ) -> None:
        self._url = url
        self._block = block
        self._master = master
        self._room = room
        self._lock = threading.Lock()  # a read is handed over, or the channel detached
        self._channel: ReadChannel | None = None
        self._idle = threading.Event()  # no read under way nor being handed over
        self._idle.set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._halt = asyncio.Event()  # set by stop(): a pause ends at once
        self._task: asyncio.Task[None] | None = None
        self._put_backs: set[asyncio.Future[None]] = set()
        self._client: redis.asyncio.Redis | None = None
        self._wake_key = keys.read_wake(uuid.uuid4().hex)
        self._waker: redis.Redis | None = None  # pushes the wake token (any thread)
        self._blmpop = True
        self._stopped = False
        #: Messages read so far, and reads that returned some (the pool's stats show them).
        self.messages = 0
        self.reads = 0

    # -- any thread ---------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start reading on ``loop`` (from any thread); reads begin once attached."""
        self._loop = loop
        loop.call_soon_threadsafe(self._begin)

    def attach(self, channel: ReadChannel) -> None:
        """Read the queues ``channel`` consumes, and hand it what is read."""
        with self._lock:
            self._channel = channel
        self.wake()

    def detach(self, patience: float = DETACH_PATIENCE) -> None:
        """Hand nothing more to the channel; return once no read is being handed over.

        Called from Celery's consumer thread, before the channel puts back what it holds.
        """
        with self._lock:
            if self._channel is None:
                return
            self._channel = None
        if not self._idle.is_set():
            self._unblock()
            if not self._idle.wait(patience):
                logger.warning(
                    "the asyncio pool's read of its queues did not end within %.0f s", patience
                )

    def wake(self) -> None:
        """Look again: a channel attached, its queues changed, or a slot freed."""
        loop, wake = self._loop, self._wake
        if loop is None or wake is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(wake.set)
        except RuntimeError:  # the loop closed meanwhile
            pass

    def room_freed(self) -> None:
        """A call ended (on the loop): look again."""
        if self._wake is not None:
            self._wake.set()

    async def stop(self) -> None:
        """Stop reading (on the loop): detached, the read under way ended and any put-back done."""
        self._stopped = True
        self._halt.set()
        await asyncio.get_running_loop().run_in_executor(None, self.detach)
        if self._wake is not None:
            self._wake.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        if self._put_backs:
            await asyncio.gather(*self._put_backs, return_exceptions=True)
        if self._client is not None:
            with contextlib.suppress(redis.RedisError, OSError):
                await self._client.delete(self._wake_key)
            await self._client.aclose()
            await self._client.connection_pool.disconnect()
        if self._waker is not None:
            self._waker.close()

    # -- the loop -----------------------------------------------------------------------

    def _begin(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        assert self._wake is not None  # made by _begin, on this loop, before this runs
        pauses = retry_pauses(math.inf)
        while not self._stopped:
            channel = self._channel
            lists = channel.toolexec_read_lists() if channel is not None else []
            room = self._room()
            if channel is None or not lists or room <= 0:
                # A wake-up is set on this thread, so none is lost between these lines.
                self._wake.clear()
                await self._wake.wait()
                continue
            failed = await self._read_and_hand_over(channel, lists, min(room, MAX_READ))
            if not failed:
                pauses = retry_pauses(math.inf)
                continue
            pause = next(pauses, 1.0)  # never runs out: its patience is endless
            logger.warning(
                "the asyncio pool could not read its queues (%s); reading again in %.2f s",
                failed,
                pause,
            )
            # Not while detaching waits: the read is over. stop() ends the pause.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._halt.wait(), pause)

    async def _read_and_hand_over(self, channel: ReadChannel, lists: list[str], room: int) -> str:
        """One read, handed over (or put back); what failed, or "" when nothing did."""
        self._idle.clear()
        try:
            if self._channel is not channel:
                return ""  # detached meanwhile: do not start a read for it
            reply = await self._read(lists, room)
            if reply is not None:
                self._hand_over(channel, *reply)
            return ""
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            return type(exc).__name__
        except redis.ResponseError as exc:
            if not self._blmpop:
                return f"the broker refused it: {str(exc)[:200]}"
            self._blmpop = False
            logger.warning(
                "the broker refused BLMPOP (%s): reading one message per BRPOP",
                str(exc).split("\n", 1)[0][:200],
            )
            return ""
        except Exception:  # the loop reads on; Celery's own handling has logged the rest
            logger.exception("the asyncio pool could not hand a read of its queues over")
            return ""
        finally:
            self._idle.set()

    async def _read(self, lists: list[str], room: int) -> tuple[str, list[bytes]] | None:
        """One read: (the list popped from, its items), or None after the block passed or
        a wake token was popped."""
        client = self._connection()
        keys_read = [*lists, self._wake_key]
        if self._blmpop:
            reply = await client.execute_command(  # type: ignore[no-untyped-call]
                "BLMPOP", self._block, len(keys_read), *keys_read, "RIGHT", "COUNT", room
            )
            if not reply:
                return None
            popped_from, items = _text(reply[0]), list(reply[1])
        else:
            reply = await client.execute_command("BRPOP", *keys_read, self._block)  # type: ignore[no-untyped-call]
            if not reply:
                return None
            popped_from, items = _text(reply[0]), [reply[1]]
        return None if popped_from == self._wake_key else (popped_from, items)

    def _hand_over(self, channel: ReadChannel, popped_from: str, items: list[bytes]) -> None:
        self.reads += 1
        self.messages += len(items)
        with self._lock:
            if self._channel is channel:
                channel.toolexec_deliver_read(popped_from, items)
                return
        # Detached while the read was under way: back on the queue, off the loop (the
        # put-back waits for Redis while it is away); stop() waits for it.
        loop = asyncio.get_running_loop()
        put_back = loop.run_in_executor(None, channel.toolexec_put_back_unread, items, popped_from)
        self._put_backs.add(put_back)
        put_back.add_done_callback(self._put_backs.discard)

    def _connection(self) -> redis.asyncio.Redis:
        if self._client is None:
            pool = async_pool(
                self._url,
                master=self._master,
                socket_timeout=self._block + SOCKET_TIMEOUT - READ_BLOCK,
                socket_connect_timeout=2.0,
                retry=Retry(NoBackoff(), 0),  # the reader pauses and reads again itself
            )
            self._client = redis.asyncio.Redis(connection_pool=pool, single_connection_client=True)
        return self._client

    def _unblock(self) -> None:
        """End the read under way: push a token on the list it also blocks on."""
        try:
            if self._waker is None:
                self._waker = sync_client(
                    self._url, master=self._master, socket_timeout=2.0, socket_connect_timeout=2.0
                )
            pipe = self._waker.pipeline(transaction=False)
            pipe.lpush(self._wake_key, b"wake")
            pipe.expire(self._wake_key, keys.READ_WAKE_TTL)
            pipe.execute()
        except redis.RedisError as exc:  # refused, or Redis is away: the block ends it
            logger.debug("could not end the pool's read at once: %s", type(exc).__name__)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
