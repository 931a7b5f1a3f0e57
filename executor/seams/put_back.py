"""Putting back, once, the calls a worker had taken when its broker connection broke;
and standing down their copies still waiting in this process.

**On the queue.** When the worker's broker connection breaks (Redis restarts), kombu
puts the messages the worker had taken but not acknowledged (prefetched calls not yet
started) back on their queues at once, and, Redis being down at that moment, logs
"UNABLE TO RESTORE" and loses them. :meth:`PutBacks.restore` keeps trying for
:data:`RESTORE_PATIENCE` seconds, each put-back at most once
(:data:`wire.copies.PUT_BACK` under :func:`wire.keys.restored`), so a put-back whose
reply was lost is not queued twice. So does :meth:`PutBacks.put_back_unread` for the
messages a batched read took but had not delivered when delivering one of them raised
(:mod:`executor.seams.transport`), each once under the item's SHA-256.

**In this process.** The worker takes the messages put back again once Redis is back.
On the threads and asyncio pools a call taken but not started waits in the pool for a
slot, and would run from that copy too: twice in all. (On prefork Celery drops the jobs
not written to a child, ``AsynPool.flush``; a child starts a job as it reads it.)

The process's :class:`Ledger` (:data:`LEDGER`) keeps that account. Each delivery the
main process receives is numbered (:meth:`Ledger.receive`, in the request's
:data:`COPY_KEY` field, :mod:`executor.seams.request`). A put-back first reserves its
delivery (:meth:`Ledger.reserve`: the last number given out), and ends by marking those
copies stale, or, if it gave up (Redis stayed away for :data:`RESTORE_PATIENCE`), by
letting them run (:meth:`Ledger.settle`). The task body calls :meth:`Ledger.begin`
before it starts: a stale copy does not run, one whose put-back is under way waits for
its end, and any other counts as begun, which a put-back then leaves alone: under one
lock, a copy begins or its delivery goes back, never both. The copy taken again from
the queue has a higher number and runs.

The writes to the broker are :class:`PutBacks`, an object the channel is composed with
(:class:`executor.seams.transport.Channel`): it asks the ledger, then writes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps

from executor.worker import redis_client_for_url, retry_pauses
from wire import keys
from wire.copies import FENCED, LET_GO, PUT_BACK, generation_of, sent_again

__all__ = [
    "COPY_KEY",
    "LEDGER",
    "MAX_REMEMBERED",
    "RESTORE_PATIENCE",
    "Ledger",
    "PutBacks",
    "call_id_of",
]

logger = logging.getLogger(__name__)

#: Seconds a worker keeps trying to put back the messages it had taken when its broker
#: connection broke.
RESTORE_PATIENCE = 10.0

#: The field of a task request that holds its copy's (delivery tag, number): a key of
#: Celery's request dict, which the pools hand to the task as its request's attributes
#: (not ``delivery_info``, which ``celery inspect`` shows).
COPY_KEY = "toolexec_copy"
#: Deliveries put back remembered at most, the oldest forgotten first: a break puts back
#: at most the worker's prefetch count, so this spans many breaks.
MAX_REMEMBERED = 100_000


class Ledger:
    """The copies of deliveries in this process: which may run, which went back, which began.

    Written by the consumer's one thread (receiving, putting back) and read by the task
    bodies (:meth:`begin`) and the heartbeat (:meth:`still_leaving`).
    """

    def __init__(self, *, max_remembered: int = MAX_REMEMBERED) -> None:
        self._max = max_remembered
        self._numbers = itertools.count(1)
        self._last = 0
        self._lock = threading.Lock()
        #: The last number put back, by delivery tag, the oldest forgotten first.
        self._stale: OrderedDict[str, int] = OrderedDict()
        #: Deliveries being put back (Redis may be away meanwhile), with the last number
        #: given out then: such a copy waits in :meth:`begin` until the put-back succeeded
        #: (it does not run) or gave up (it runs). Under the lock, with :attr:`_accepted`:
        #: a copy begins, or its delivery is put back, never both.
        self._pending: dict[str, int] = {}
        self._settled = threading.Condition(self._lock)
        #: Delivery tags of the calls that began here (a task body's :meth:`begin`, or
        #: a pool process's ``on_accepted``), the oldest forgotten first.
        self._accepted: OrderedDict[str, None] = OrderedDict()
        #: The calls taken but not started when the worker began to shut down.
        self._leaving: list[Any] = []
        #: The requests of the deliveries this process holds, by delivery tag (weakly).
        self._requests: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        #: The holder tags' prefix of this worker (``<worker id>|``), set when it is ready:
        #: a put-back lets go of the holder records that name this worker.
        self.holder_prefix = ""

    # -- the consumer receives, and puts back -------------------------------------------

    def receive(self, delivery_tag: object) -> list[Any]:
        """Number a delivery the main process received; what its request carries
        (:data:`COPY_KEY`).

        Called for every message, by the consumer's one thread, which also puts messages
        back: no lock on the way of every call.
        """
        self._last = next(self._numbers)
        return [str(delivery_tag), self._last]

    def taken(self, delivery_tag: object, request: Any) -> None:
        """Remember the task request of delivery ``delivery_tag`` (see :meth:`started`)."""
        self._requests[str(delivery_tag)] = request

    def reserve(self, delivery_tag: object, *, unless_begun: bool) -> int | None:
        """Begin putting back ``delivery_tag``: its copies received until now wait in
        :meth:`begin` until :meth:`settle`. Returns the number they are known by, or None
        (nothing reserved) when ``unless_begun`` and a copy of it has begun here."""
        tag = str(delivery_tag)
        with self._lock:
            if unless_begun and tag in self._accepted:
                return None
            self._pending[tag] = self._last
            return self._last

    def settle(self, delivery_tag: object, number: int, *, done: bool) -> None:
        """End :meth:`reserve`'s put-back: ``done``, its copies here are stale; else they run."""
        tag = str(delivery_tag)
        with self._settled:
            self._pending.pop(tag, None)
            if done:
                self._mark_stale(tag, number)
            self._settled.notify_all()

    def _mark_stale(self, tag: str, number: int) -> None:
        self._stale[tag] = number
        self._stale.move_to_end(tag)
        while len(self._stale) > self._max:
            self._stale.popitem(last=False)

    # -- the copies begin ------------------------------------------------------------

    def begin(self, copy: object, *, wait: bool = True) -> bool | None:
        """Whether the copy a task request's :data:`COPY_KEY` field describes may run, as
        it is about to: False if its delivery went back on its queue since it was received
        (the copy taken again runs instead). Otherwise its delivery counts as begun, so a
        put-back from now on leaves it. While one is under way this waits for its end,
        or, without ``wait``, returns None at once (ask again, waiting, off an event loop)."""
        if not isinstance(copy, list | tuple) or len(copy) != 2 or not isinstance(copy[1], int):
            return True
        tag, number = str(copy[0]), copy[1]
        ends = time.monotonic() + RESTORE_PATIENCE + 5.0
        with self._settled:
            while number <= self._pending.get(tag, 0) and (left := ends - time.monotonic()) > 0:
                if not wait:
                    return None
                self._settled.wait(left)
            if number <= self._stale.get(tag, 0):
                return False
            self._remember_accepted(tag)
            return True

    def accepted(self, delivery_tag: object) -> None:
        """Record that the call of delivery ``delivery_tag`` started in a pool process."""
        with self._lock:
            self._remember_accepted(str(delivery_tag))

    def _remember_accepted(self, tag: str) -> None:
        self._accepted[tag] = None
        while len(self._accepted) > self._max:
            self._accepted.popitem(last=False)

    def started(self, delivery_tag: object) -> bool:
        """Whether the call of delivery ``delivery_tag`` started in a pool process, or
        will: on the prefork pool, a job whose writing to a child has begun runs there,
        though the child's word that it took it (``on_accepted``) may not have reached
        this process yet (Celery's ``AsynPool.flush`` finishes writing such a job when the
        connection breaks, then drops it: the request keeps it, ``toolexec_job``)."""
        tag = str(delivery_tag)
        with self._lock:
            if tag in self._accepted:
                return True
        job = getattr(self._requests.get(tag), "toolexec_job", None)
        return getattr(job, "_write_to", None) is not None

    # -- a warm stop -----------------------------------------------------------------

    def leaving(self, requests: Iterable[Any]) -> None:
        """Remember ``requests``, taken but not started as the worker begins to shut down.

        Celery forgets such requests as its consumer closes (at the start of a warm
        shutdown), while the worker still holds their messages until its connection
        closes (at the end of one, once the running calls have finished): then they are
        put back (:meth:`PutBacks.restore`). Meanwhile the heartbeat goes on naming this
        worker as their holder (:meth:`still_leaving`), so that no waiting client takes
        them for lost.
        """
        with self._lock:
            self._leaving[:] = list(requests)

    def still_leaving(self) -> list[Any]:
        """The requests :meth:`leaving` remembered that were neither put back nor started."""
        with self._lock:
            stale = dict(self._stale)
            accepted_tags = set(self._accepted)
            remembered = list(self._leaving)
        kept = []
        for request in remembered:
            copy = getattr(request, COPY_KEY, None) or request.request_dict.get(COPY_KEY)
            tag = copy[0] if isinstance(copy, list | tuple) and copy else None
            if tag is None or tag in accepted_tags or copy[1] <= stale.get(tag, 0):
                continue
            kept.append(request)
        return kept


#: This process's ledger: its worker's one consumer writes it, its task bodies ask it.
LEDGER = Ledger()


class PutBacks:
    """The put-backs of a channel (:class:`executor.seams.transport.Channel`): each
    message it took and did not start goes back on its queue once, while Redis is away.

    The channel gives the broker's and the store's URLs (its transport options
    ``toolexec_broker_url``, ``toolexec_redis_url``), its queues' spelling and its
    connection errors; the ledger says what may go back.
    """

    def __init__(self, channel: kombu_redis.Channel, ledger: Ledger = LEDGER) -> None:
        self._channel = channel
        self._ledger = ledger

    def restore(self, message: Any, leftmost: bool = False) -> None:
        """Put a taken message back on its queues, once, trying while Redis is away.

        kombu puts back every message not acknowledged when the connection closes (a
        broken connection, or the end of a shutdown: ``leftmost`` false), and a message
        Celery rejects to requeue it (its pool process died: ``leftmost`` true). Of the
        first kind, a call that has started (an at-least-once call, acknowledged once it
        ends) is not put back: it runs on in this worker, whose connection comes back or
        whose warm shutdown waits for it, and its outcome reaches its caller through the
        store. Put back, another worker would run it a second time beside it. If it dies
        with its process instead, its caller's watchdog sends it again.
        """
        ledger, tag = self._ledger, message.delivery_tag
        started = not leftmost and ledger.started(tag)
        number = None if started else ledger.reserve(tag, unless_begun=not leftmost)
        if number is None:
            logger.info("call %s has started here: it is not put back", message.headers.get("id"))
            return
        try:
            self._restore_reserved(message)
        except BaseException:
            ledger.settle(tag, number, done=False)  # gave up: its copy here runs
            raise
        ledger.settle(tag, number, done=True)  # its copy in this process must not run

    def _restore_reserved(self, message: Any) -> None:
        channel = self._channel
        info = message.delivery_info
        exchange, routing_key = info["exchange"], info["routing_key"]
        payload = message.serializable()
        priority = channel._get_message_priority(payload, reverse=False)  # type: ignore[no-untyped-call]
        origin = getattr(message, "toolexec_origin", None)
        if origin is not None:
            # The copy put back is the text this worker took, as a copy sent again
            # (wire.copies): the client's watchdog finds it in the queue by that text,
            # and it asks before it starts.
            envelope = sent_again(origin[1], generation_of(origin[1]) or 0)
        else:  # a message this channel did not read itself: kombu's own spelling
            payload["redelivered"] = True
            envelope = dumps(payload)  # type: ignore[no-untyped-call]
        call_id = message.headers.get("id") if isinstance(message.headers, dict) else None

        def attempt() -> None:
            # A toolexec call goes to the default exchange: its queue is its routing
            # key, no binding to read. kombu restores as the consumer restarts, when
            # the channel's own connection may already be gone: put back through
            # this process's client of the broker.
            queues = [routing_key] if not exchange else channel._lookup(exchange, routing_key)  # type: ignore[no-untyped-call]
            with self._broker() as client:
                for queue in queues:
                    self._put_back_once(
                        client,
                        channel._q_for_pri(queue, priority),  # type: ignore[no-untyped-call]
                        keys.restored(str(message.delivery_tag), queue),
                        call_id,
                        envelope,
                    )

        self._while_broker_away(attempt)

    def put_back_unread(self, items: Sequence[bytes], queue: str) -> None:
        """Put items a read took from the list ``queue`` but never delivered back, each once."""
        if not items:
            return

        def attempt() -> None:
            # Back at the front, in the order they were taken: the first taken is the
            # next read (the last pushed on the end reads come from).
            with self._broker() as client:
                for item in reversed(items):
                    envelope = (
                        sent_again(item, generation_of(item) or 0) if _is_envelope(item) else item
                    )
                    marker = keys.restored(hashlib.sha256(item).hexdigest(), queue)
                    self._put_back_once(client, queue, marker, call_id_of(item), envelope)

        try:
            self._while_broker_away(attempt)
        except self._channel.connection_errors:
            logger.error(
                "could not put back %d messages taken from %s: the broker stayed away",
                len(items),
                queue,
            )

    def _put_back_once(
        self,
        broker: redis.Redis,
        queue: str,
        marker: str,
        call_id: str | None,
        envelope: str | bytes,
    ) -> None:
        """Put ``envelope`` back at the front of ``queue`` once, unless its call was given
        up, and let go of the holder record naming this worker (:data:`wire.copies.PUT_BACK`)."""
        record, fence = (keys.running(call_id), keys.fence(call_id)) if call_id else ("", "")
        prefix = self._ledger.holder_prefix
        args = [keys.RESTORED_TTL * 1000, envelope, prefix]
        store_url = getattr(self._channel, "toolexec_redis_url", None)
        if not call_id or store_url is None or store_url == self._broker_url():
            # The broker holds the records too: one step (with no call id, none to read).
            PUT_BACK.run(broker, [queue, marker, record or marker, fence or marker], args)
            return
        store = redis_client_for_url(store_url, master=self._sentinel_master())
        if store.get(fence) == FENCED.encode():
            return  # given up: the copy would never start
        PUT_BACK.run(broker, [queue, marker, record, fence], args)  # neither key is on the broker
        if prefix:
            LET_GO.run(store, [record], [prefix])

    def _broker_url(self) -> str | None:
        return getattr(self._channel, "toolexec_broker_url", None)

    def _sentinel_master(self) -> str | None:
        return getattr(self._channel, "toolexec_sentinel_master", None)

    @contextmanager
    def _broker(self) -> Iterator[redis.Redis]:
        """A client of the broker: this process's for ``toolexec_broker_url``, else the
        channel's."""
        url = self._broker_url()
        if url is None:
            with self._channel.conn_or_acquire() as client:
                yield client
        else:
            yield redis_client_for_url(url, master=self._sentinel_master())

    def _while_broker_away(self, attempt: Callable[[], None]) -> None:
        """Run ``attempt``, again after each connection error for :data:`RESTORE_PATIENCE`
        seconds; the last error is raised."""
        pauses = retry_pauses(RESTORE_PATIENCE)
        while True:
            try:
                attempt()
                return
            except self._channel.connection_errors:
                pause = next(pauses, None)
                if pause is None:
                    raise
                time.sleep(pause)


def _is_envelope(item: bytes) -> bool:
    # A JSON object: what the client pushes. Anything else goes back as it was, to be
    # refused (dead-lettered) when it is read again.
    return item[:1] == b"{"


def call_id_of(item: bytes) -> str | None:
    """The call id (Celery's task id) in an envelope's headers; None if it has none."""
    try:
        headers = json.loads(item).get("headers")
    except (ValueError, AttributeError):
        return None
    call_id = headers.get("id") if isinstance(headers, dict) else None
    return call_id if isinstance(call_id, str) else None
