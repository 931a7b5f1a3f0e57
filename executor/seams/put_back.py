"""Putting back, once, the calls a worker had taken when its broker connection broke;
and standing down their copies still waiting in this process.

**On the queue.** When the worker's broker connection breaks (Redis restarts), kombu
puts the messages the worker had taken but not acknowledged (prefetched calls not yet
started) back on their queues at once, and, Redis being down at that moment, logs
"UNABLE TO RESTORE" and loses them. :meth:`PutBack._restore` keeps trying for
:data:`RESTORE_PATIENCE` seconds, each put-back at most once
(:data:`wire.copies.PUT_BACK` under :func:`wire.keys.restored`), so a put-back whose
reply was lost is not queued twice. So does :meth:`PutBack._put_back_unread` for the
messages a batched read took but had not delivered when delivering one of them raised
(:mod:`executor.seams.batched_read`), each once under the item's SHA-256.

**In this process.** The worker takes the messages put back again once Redis is back.
On the threads and asyncio pools a call taken but not started waits in the pool for a
slot, and would run from that copy too: twice in all. (On prefork Celery drops the jobs
not written to a child, ``AsynPool.flush``; a child starts a job as it reads it.)

So each delivery the main process receives is numbered (:func:`receive`, in the
request's :data:`COPY_KEY` field, :mod:`executor.seams.request`). A put-back first
reserves its delivery (:func:`reserve`: the last number given out), and ends by marking
those copies stale, or, if it gave up (Redis stayed away for :data:`RESTORE_PATIENCE`),
by letting them run (:func:`settle`). The task body calls :func:`begin` before it
starts: a stale copy does not run, one whose put-back is under way waits for its end,
and any other counts as begun, which a put-back then leaves alone: under one lock, a
copy begins or its delivery goes back, never both. The copy taken again from the
queue has a higher number and runs.
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
    "MAX_REMEMBERED",
    "RESTORE_PATIENCE",
    "PutBack",
    "accepted",
    "begin",
    "call_id_of",
    "is_stale",
    "leaving",
    "put_back",
    "receive",
    "reserve",
    "set_holder_prefix",
    "settle",
    "started",
    "still_leaving",
    "taken",
]

logger = logging.getLogger(__name__)

#: Seconds a worker keeps trying to put back the messages it had taken when its broker
#: connection broke.
RESTORE_PATIENCE = 10.0

# -- the copies in this process -------------------------------------------------------

#: The field of a task request that holds its copy's (delivery tag, number): a key of
#: Celery's request dict, which the pools hand to the task as its request's attributes
#: (not ``delivery_info``, which ``celery inspect`` shows).
COPY_KEY = "toolexec_copy"
#: Deliveries put back remembered at most, the oldest forgotten first: a break puts back
#: at most the worker's prefetch count, so this spans many breaks.
MAX_REMEMBERED = 100_000

_numbers = itertools.count(1)
_last = 0
_stale: OrderedDict[str, int] = OrderedDict()
_lock = threading.Lock()
#: Deliveries being put back (Redis may be away meanwhile), with the last number given out
#: then: such a copy waits in :func:`begin` until the put-back succeeded (it does not run)
#: or gave up (it runs). Under :data:`_lock`, with :data:`_accepted`: a copy begins, or its
#: delivery is put back, never both.
_pending: dict[str, int] = {}
_settled = threading.Condition(_lock)


def receive(delivery_tag: object) -> list[Any]:
    """Number a delivery the main process received; what its request carries (:data:`COPY_KEY`).

    Called for every message, by the consumer's one thread, which also puts messages
    back: no lock on the way of every call.
    """
    global _last
    _last = next(_numbers)
    return [str(delivery_tag), _last]


def put_back(delivery_tag: object) -> None:
    """Record that the delivery ``delivery_tag`` went back on its queue: every copy of it
    received until now is stale."""
    with _lock:
        _mark_stale(str(delivery_tag), _last)


def _mark_stale(tag: str, number: int) -> None:
    _stale[tag] = number
    _stale.move_to_end(tag)
    while len(_stale) > MAX_REMEMBERED:
        _stale.popitem(last=False)


def reserve(delivery_tag: object, *, unless_begun: bool) -> int | None:
    """Begin putting back ``delivery_tag``: its copies received until now wait in
    :func:`begin` until :func:`settle`. Returns the number they are known by, or None
    (nothing reserved) when ``unless_begun`` and a copy of it has begun here."""
    tag = str(delivery_tag)
    with _lock:
        if unless_begun and tag in _accepted:
            return None
        _pending[tag] = _last
        return _last


def settle(delivery_tag: object, number: int, *, done: bool) -> None:
    """End :func:`reserve`'s put-back: ``done``, its copies here are stale; else they run."""
    tag = str(delivery_tag)
    with _settled:
        _pending.pop(tag, None)
        if done:
            _mark_stale(tag, number)
        _settled.notify_all()


def begin(copy: object, *, wait: bool = True) -> bool | None:
    """Whether the copy a task request's :data:`COPY_KEY` field describes may run, as it
    is about to: False if its delivery went back on its queue since it was received (the
    copy taken again runs instead). Otherwise its delivery counts as begun, so a put-back
    from now on leaves it. While one is under way this waits for its end, or, without
    ``wait``, returns None at once (ask again, waiting, off an event loop)."""
    if not isinstance(copy, list | tuple) or len(copy) != 2 or not isinstance(copy[1], int):
        return True
    tag, number = str(copy[0]), copy[1]
    ends = time.monotonic() + RESTORE_PATIENCE + 5.0
    with _settled:
        while number <= _pending.get(tag, 0) and (left := ends - time.monotonic()) > 0:
            if not wait:
                return None
            _settled.wait(left)
        if number <= _stale.get(tag, 0):
            return False
        _accepted[tag] = None
        while len(_accepted) > MAX_REMEMBERED:
            _accepted.popitem(last=False)
        return True


#: Delivery tags of this process's calls that started in a pool process (the request's
#: ``on_accepted``), the oldest forgotten first.
_accepted: OrderedDict[str, None] = OrderedDict()
#: The calls taken but not started when the worker began to shut down; see :func:`leaving`.
_leaving: list[Any] = []
#: The holder tags' prefix of this worker (``<worker id>|``), set when it is ready.
_holder_prefix = ""


def set_holder_prefix(prefix: str) -> None:
    """Name this worker's holder tags' prefix (``<worker id>|``): a put-back lets go of
    the holder records that name this worker."""
    global _holder_prefix
    _holder_prefix = prefix


def accepted(delivery_tag: object) -> None:
    """Record that the call of delivery ``delivery_tag`` started in a pool process."""
    with _lock:
        _accepted[str(delivery_tag)] = None
        while len(_accepted) > MAX_REMEMBERED:
            _accepted.popitem(last=False)


#: The requests of the deliveries this process holds, by delivery tag (held weakly).
_requests: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


def taken(delivery_tag: object, request: Any) -> None:
    """Remember the task request of delivery ``delivery_tag`` (see :func:`started`)."""
    _requests[str(delivery_tag)] = request


def started(delivery_tag: object) -> bool:
    """Whether the call of delivery ``delivery_tag`` started in a pool process, or will:
    on the prefork pool, a job whose writing to a child has begun runs there, though the
    child's word that it took it (``on_accepted``) may not have reached this process yet
    (Celery's ``AsynPool.flush`` finishes writing such a job when the connection breaks,
    then drops it: the request keeps it, ``toolexec_job``)."""
    tag = str(delivery_tag)
    with _lock:
        if tag in _accepted:
            return True
    job = getattr(_requests.get(tag), "toolexec_job", None)
    return getattr(job, "_write_to", None) is not None


def leaving(requests: Iterable[Any]) -> None:
    """Remember ``requests``, taken but not started as the worker begins to shut down.

    Celery forgets such requests as its consumer closes (at the start of a warm
    shutdown), while the worker still holds their messages until its connection closes
    (at the end of one, once the running calls have finished): then they are put back
    (:meth:`PutBack._restore`). Meanwhile the heartbeat goes on naming this worker as
    their holder (:func:`still_leaving`), so that no waiting client takes them for lost.
    """
    with _lock:
        _leaving[:] = list(requests)


def still_leaving() -> list[Any]:
    """The requests :func:`leaving` remembered that were neither put back nor started."""
    with _lock:
        stale = dict(_stale)
        accepted_tags = set(_accepted)
        remembered = list(_leaving)
    kept = []
    for request in remembered:
        copy = getattr(request, COPY_KEY, None) or request.request_dict.get(COPY_KEY)
        tag = copy[0] if isinstance(copy, list | tuple) and copy else None
        if tag is None or tag in accepted_tags or copy[1] <= stale.get(tag, 0):
            continue
        kept.append(request)
    return kept


def is_stale(copy: object) -> bool:
    """Whether the copy a task request's :data:`COPY_KEY` field describes was put back
    since it was received (so the copy taken again from the queue runs, not this one)."""
    if not _stale:
        return False
    if not isinstance(copy, list | tuple) or len(copy) != 2:
        return False
    tag, number = copy
    if not isinstance(number, int):
        return False
    with _lock:
        return number <= _stale.get(str(tag), 0)


# -- the channel's put-backs ----------------------------------------------------------


class PutBack(kombu_redis.Channel):
    """The put-backs of toolexec's channel (:class:`executor.seams.transport.Channel`)."""

    #: The broker's URL, for putting messages back after the channel's own connection
    #: is gone (the transport option ``toolexec_broker_url``).
    toolexec_broker_url: str | None = None
    #: The Redis of toolexec's records (fences, holder records; ``toolexec_redis_url``).
    toolexec_redis_url: str | None = None

    def close(self) -> None:
        """Close the channel, and the connections the put-backs made while it closed."""
        super().close()  # type: ignore[no-untyped-call]
        # kombu puts back what was taken after it disconnected the channel's pools: an
        # exchange lookup then made a new one, which nothing else would close.
        self._disconnect_pools()  # type: ignore[no-untyped-call]

    def _restore(self, message: Any, leftmost: bool = False) -> None:
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
        if self.ack_emulation:  # kombu's own transaction on its unacked hash
            super()._restore(message, leftmost)  # type: ignore[no-untyped-call]
            return
        tag = message.delivery_tag
        number = None if not leftmost and started(tag) else reserve(tag, unless_begun=not leftmost)
        if number is None:
            logger.info("call %s has started here: it is not put back", message.headers.get("id"))
            return
        try:
            self._restore_reserved(message)
        except BaseException:
            settle(tag, number, done=False)  # gave up: its copy here runs
            raise
        settle(tag, number, done=True)  # its copy in this process must not run

    def _restore_reserved(self, message: Any) -> None:
        info = message.delivery_info
        exchange, routing_key = info["exchange"], info["routing_key"]
        payload = message.serializable()
        priority = self._get_message_priority(payload, reverse=False)  # type: ignore[no-untyped-call]
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
            queues = [routing_key] if not exchange else self._lookup(exchange, routing_key)  # type: ignore[no-untyped-call]
            with self._broker() as client:
                for queue in queues:
                    self._put_back_once(
                        client,
                        self._q_for_pri(queue, priority),  # type: ignore[no-untyped-call]
                        keys.restored(str(message.delivery_tag), queue),
                        call_id,
                        envelope,
                    )

        self._while_broker_away(attempt)

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
        args = [keys.RESTORED_TTL * 1000, envelope, _holder_prefix]
        store_url = self.toolexec_redis_url
        if not call_id or store_url is None or store_url == self.toolexec_broker_url:
            # The broker holds the records too: one step (with no call id, none to read).
            PUT_BACK.run(broker, [queue, marker, record or marker, fence or marker], args)
            return
        store = redis_client_for_url(store_url)
        if store.get(fence) == FENCED.encode():
            return  # given up: the copy would never start
        PUT_BACK.run(broker, [queue, marker, record, fence], args)  # neither key is on the broker
        if _holder_prefix:
            LET_GO.run(store, [record], [_holder_prefix])

    def _put_back_unread(self, items: Sequence[bytes], queue: str) -> None:
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
        except self.connection_errors:
            logger.error(
                "could not put back %d messages taken from %s: the broker stayed away",
                len(items),
                queue,
            )

    @contextmanager
    def _broker(self) -> Iterator[redis.Redis]:
        """A client of the broker: this process's for ``toolexec_broker_url``, else the
        channel's."""
        if self.toolexec_broker_url is None:
            with self.conn_or_acquire() as client:
                yield client
        else:
            yield redis_client_for_url(self.toolexec_broker_url)

    def _while_broker_away(self, attempt: Callable[[], None]) -> None:
        """Run ``attempt``, again after each connection error for :data:`RESTORE_PATIENCE`
        seconds; the last error is raised."""
        pauses = retry_pauses(RESTORE_PATIENCE)
        while True:
            try:
                attempt()
                return
            except self.connection_errors:
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
