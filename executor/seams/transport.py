"""kombu's Redis transport: one channel that refuses a queue item it cannot read instead
of dying on it, takes many messages per read, and puts back what it took and did not start.

kombu's Redis channel pops an item with ``BRPOP`` and decodes it in the worker's main
process (``Channel._brpop_read``: ``loads(bytes_to_str(item))``), then builds a
message from it (``virtual.Message.__init__``: ``payload['properties']``, the body's
``body_encoding``). Any exception there (one ``LPUSH 'garbage'`` is enough) leaves
the worker's event loop and stops the worker. This transport, selected through
Celery's ``broker_transport`` setting (:mod:`executor.seams.app`), differs in two
places:

* :class:`Channel` reads each popped item through :meth:`Channel._accept_item`: too
  large, not UTF-8 JSON, or not kombu's envelope, and it is dead-lettered
  (:mod:`executor.seams.deadletter`) and dropped, and the loop goes on;
* its :class:`Message` raises :class:`RefusedItem` for an envelope it cannot build;
  the channel catches that around the delivery and dead-letters the item.

kombu offers no hook between ``BRPOP`` and ``loads``, so ``_brpop_read`` is kombu
5.7.0's, copied with the call to ``loads`` replaced by the guarded delivery and a turn
to the batched read when ``BLMPOP`` is under way;
``tests/worker/test_poison_transport.py`` pins kombu's source and fails when kombu
changes it. The item stays in memory with its message (``Message.toolexec_origin``),
so a refusal later in the main process records the exact bytes that were on the queue.

**One wake-up takes many messages**: ``BLMPOP`` within prefetch. kombu sends one
``BRPOP`` per message, and each is a round trip and several system calls in the worker's
main process, which also runs Celery's consumer (on the asyncio
pool, every system call is then a wait for the GIL the loop thread holds).
:meth:`Channel._brpop_start` sends ``BLMPOP ... RIGHT COUNT n`` instead (Redis 7.0):
it blocks like ``BRPOP`` and pops, from the first queue that has any, up to ``n``
messages in the same order ``BRPOP`` would. ``n`` is the room prefetch leaves
(``qos.can_consume_max_estimate()``, at most :data:`BATCH_MAX`), so the worker never
holds more than its prefetch count, and each message is delivered, one after another,
exactly as one from ``BRPOP`` (through the guarded decoding above). What changes is only
the window between popping a message and handing it to Celery, which now spans the
messages of one read:

* with kombu's ack emulation off (the default), a message popped is held only in the
  worker's memory either way, until it is acknowledged: a worker killed in that window
  loses it, and the client's watchdog notices the call held by a dead worker (the
  heartbeat names the messages of a read not yet handed to Celery, :func:`in_hand`,
  as it names the calls waiting for a process: on the solo pool they wait as long as
  the calls before them run). A read whose reply Redis sent as the connection broke
  loses its messages unrecorded, and the watchdog notices them neither queued nor held
  (docs/guarantees.md): one message with ``BRPOP``, up to :data:`BATCH_MAX` with
  ``BLMPOP``;
* with ack emulation on, kombu records each message in its unacknowledged hash as it is
  delivered; so that no more than one popped message is ever outside that hash, the
  channel reads one ``BRPOP`` at a time, as kombu does;
* if delivering one message of a read raises (the broker connection broke, and Celery's
  consumer must restart), the messages after it are put back on their queue, each once,
  trying for :data:`~executor.seams.put_back.RESTORE_PATIENCE` seconds
  (:meth:`~executor.seams.put_back.PutBacks.put_back_unread`).

A server that refuses ``BLMPOP`` (older than 7.0, or an ACL without it) is read with
``BRPOP`` from then on, after one WARNING; so is a channel with a ``global_keyprefix``,
and one whose ``can_consume`` Celery replaced (``worker_disable_prefetch``: one message
whenever a pool slot is free).

**The messages taken but not started when the broker connection breaks are put back**,
once, while Redis is away: the channel is composed with
:class:`~executor.seams.put_back.PutBacks`, which asks the process's ledger of copies
(:data:`~executor.seams.put_back.LEDGER`) what may go back, and writes it.

Only the worker's path is guarded: ``basic_get`` (``Channel._get``), which a worker
never uses, still decodes as kombu does.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from functools import cached_property
from queue import Empty
from typing import Any

import redis
from kombu.exceptions import DecodeError
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads

from executor.pools.reads import MAX_READ
from executor.seams.deadletter import Refusal, dead_letter, describe
from executor.seams.put_back import PutBacks, call_id_of
from executor.worker import redis_client_for_url

__all__ = [
    "BATCH_MAX",
    "BROKER_URL_OPTION",
    "MAX_ITEM_OPTION",
    "REDIS_URL_OPTION",
    "SENTINEL_MASTER_OPTION",
    "SentinelTransport",
    "Channel",
    "Message",
    "RefusedItem",
    "Transport",
    "envelope_problem",
    "in_hand",
]

#: Transport option: the Redis that holds toolexec's keys (the dead-letter list).
REDIS_URL_OPTION = "toolexec_redis_url"
#: The transport option naming the group of a ``sentinel://`` URL (``wire.connect``).
SENTINEL_MASTER_OPTION = "toolexec_sentinel_master"
#: Transport option: the largest item, in bytes, a worker reads from a queue.
MAX_ITEM_OPTION = "toolexec_max_item_bytes"
#: Transport option: the broker's URL, for putting messages back after the channel's
#: own connection is gone (:meth:`executor.seams.put_back.PutBacks.restore`).
BROKER_URL_OPTION = "toolexec_broker_url"

#: Most messages one read (``BLMPOP``) takes; fewer when prefetch leaves less room. A
#: read's messages are handed to Celery one after another in one turn of the consumer's
#: event loop, so this bounds how long a turn lasts. The asyncio pool's reader takes as
#: many at most (one bound for both).
BATCH_MAX = MAX_READ

logger = logging.getLogger(__name__)

#: What :meth:`Channel._accept_item` returns for an item it refused (``None`` is the
#: JSON item ``null``, which must be refused as no envelope, not dropped unrecorded).
_REFUSED: Any = object()


class RefusedItem(Exception):
    """A queue item the channel will not deliver; ``detail`` never quotes it."""

    def __init__(self, reason: Refusal, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def envelope_problem(payload: Any, channel: Any) -> str:
    """What keeps ``payload`` from being kombu's Redis envelope; "" when nothing does.

    Checks what building and acknowledging the message reads, so neither can fail.
    """
    if not isinstance(payload, dict):
        return "not a JSON object"
    properties = payload.get("properties")
    if not isinstance(properties, dict):
        return "no properties object"
    tag = properties.get("delivery_tag")
    if not isinstance(tag, str) or not tag:
        return "no delivery tag string"
    info = properties.get("delivery_info")
    if not (
        isinstance(info, dict)
        and isinstance(info.get("exchange"), str)
        and isinstance(info.get("routing_key"), str)
    ):
        return "no delivery_info with exchange and routing_key strings"
    encoding = properties.get("body_encoding")
    if encoding is not None and not (
        isinstance(encoding, str) and (encoding.lower() == "utf-8" or encoding in channel.codecs)
    ):
        return "an unknown body_encoding"
    if not isinstance(payload.get("body"), str):
        return "no body string"
    if not isinstance(payload.get("headers"), dict | None):
        return "headers that are not an object"
    for field in ("content-type", "content-encoding"):
        if not isinstance(payload.get(field), str | None):
            return f"a {field} that is not a string"
    return ""


class Message(virtual.Message):
    """kombu's message, built only from a well-formed envelope.

    Raises:
        RefusedItem: The envelope is malformed, or its body does not decode.
    """

    def __init__(self, payload: Any, channel: Any = None, **kwargs: Any) -> None:
        problem = envelope_problem(payload, channel)
        if problem:
            raise RefusedItem(Refusal.NOT_AN_ENVELOPE, problem)
        try:
            super().__init__(payload, channel=channel, **kwargs)  # type: ignore[no-untyped-call]
        except Exception as exc:  # noqa: BLE001 - base64 and the like; refused
            raise RefusedItem(
                Refusal.NOT_AN_ENVELOPE, f"the body does not decode ({describe(exc)})"
            ) from None
        #: (queue, item) as popped, while the channel delivers it; None otherwise.
        self.toolexec_origin: tuple[str, bytes] | None = getattr(
            channel, "_toolexec_delivering", None
        )

    def _decode(self) -> Any:
        """The body as kombu's registry decodes it, with a JSON body read by
        :func:`_envelope_loads` (kombu's own ``loads`` only where its hook can apply: about
        a twentieth of the asyncio pool's main process went to that hook and its decoder
        made anew per message). The same checks first: an accepted content type, and the
        same error, kombu's ``DecodeError``. ``tests/unit/test_envelope_decoding.py`` holds
        it to kombu's answer."""
        body, accept = self.body, self.accept
        if (
            self.content_type != _JSON
            or accept is None
            or _JSON not in accept
            or not body
            or not isinstance(body, bytes | str)
        ):
            return super()._decode()  # type: ignore[no-untyped-call]
        try:
            return _envelope_loads(body.decode("utf-8") if isinstance(body, bytes) else body)
        except Exception as exc:
            raise DecodeError(exc) from exc


class Channel(kombu_redis.Channel):
    """kombu's Redis channel that refuses an item it cannot read instead of raising,
    takes many messages per read, and puts back, once, what it took and did not start."""

    Message = Message
    from_transport_options = (  # type: ignore[assignment]  # kombu types its own tuple's length
        *kombu_redis.Channel.from_transport_options,
        REDIS_URL_OPTION,
        MAX_ITEM_OPTION,
        BROKER_URL_OPTION,
        SENTINEL_MASTER_OPTION,
    )

    #: The Redis of toolexec's records (the dead-letter list, fences, holder records).
    toolexec_redis_url: str | None = None
    toolexec_max_item_bytes: int | None = None
    #: The broker's URL, for putting messages back after the channel's own connection
    #: is gone.
    toolexec_broker_url: str | None = None
    #: The group a ``sentinel://`` URL of either names (``TOOLEXEC_SENTINEL_MASTER``).
    toolexec_sentinel_master: str | None = None
    _toolexec_delivering: tuple[str, bytes] | None = None
    #: False once the server refused ``BLMPOP``: read with ``BRPOP`` from then on.
    _toolexec_blmpop = True
    #: How many messages the read under way asked for; 0 while it is kombu's ``BRPOP``.
    _toolexec_asked = 0
    #: Set while the asyncio pool's loop reads the queues: tells its reader to look again.
    _toolexec_reader: Callable[[], None] | None = None

    @cached_property
    def put_backs(self) -> PutBacks:
        """This channel's put-backs (:class:`~executor.seams.put_back.PutBacks`)."""
        return PutBacks(self)

    def close(self) -> None:
        """Close the channel, and the connections the put-backs made while it closed."""
        super().close()  # type: ignore[no-untyped-call]
        # kombu puts back what was taken after it disconnected the channel's pools: an
        # exchange lookup then made a new one, which nothing else would close.
        self._disconnect_pools()  # type: ignore[no-untyped-call]

    def _restore(self, message: Any, leftmost: bool = False) -> None:
        """Put a taken message back on its queues (:meth:`PutBacks.restore`); with kombu's
        ack emulation on, kombu's own transaction on its unacknowledged hash does."""
        if self.ack_emulation:
            super()._restore(message, leftmost)  # type: ignore[no-untyped-call]
            return
        self.put_backs.restore(message, leftmost)

    # kombu 5.7.0's Channel._brpop_read, with ``self.connection._deliver(loads(...))``
    # replaced by ``self._deliver_item(item, dest)``, after the turn to the batched read
    # when BLMPOP is under way. Pinned by a test; keep in step.
    def _brpop_read(self, **options: Any) -> bool:
        if self._toolexec_asked:
            self._toolexec_asked = 0
            return self._blmpop_read(**options)
        try:
            try:
                dest__item = self.client.parse_response(self.client.connection, "BRPOP", **options)
            except self.connection_errors:
                # if there's a ConnectionError, disconnect so the next
                # iteration will reconnect automatically.
                self.client.connection.disconnect()
                raise
            if dest__item:
                dest, item = dest__item
                dest = bytes_to_str(dest).rsplit(self.sep, 1)[0]  # type: ignore[no-untyped-call]
                self._queue_cycle.rotate(dest)
                self._deliver_item(item, dest)
                return True
            else:
                raise Empty()
        finally:
            self._in_poll = None  # type: ignore[assignment]
            # The BRPOP connection is now idle: the moment to flush a pending re-auth token.
            self._flush_brpop_reauth()  # type: ignore[no-untyped-call]

    def _brpop_start(self, timeout: int | None = None) -> None:
        """Wait for messages: ``BLMPOP`` for as many as prefetch leaves room for, else ``BRPOP``;
        nothing while the asyncio pool's loop reads the queues (:meth:`toolexec_read_on_loop`).

        kombu 5.7.0's ``Channel._brpop_start`` with another command; pinned by a test.
        """
        if self._toolexec_reader is not None:
            return
        count = self._batch_size()
        if count <= 1:
            self._toolexec_asked = 0
            super()._brpop_start(timeout)  # type: ignore[no-untyped-call]
            return
        if timeout is None:
            timeout = self.brpop_timeout
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        lists = [self._q_for_pri(queue, pri) for pri in self.priority_steps for queue in queues]  # type: ignore[no-untyped-call]
        self._in_poll = self.client.connection
        self._brpop_sent_at = time.monotonic()  # type: ignore[assignment]  # kombu: None until sent
        self._toolexec_asked = count
        self.client.connection.send_command(
            "BLMPOP", timeout or 0, len(lists), *lists, "RIGHT", "COUNT", count
        )

    # -- read by the asyncio pool's loop (executor.pools.reads) ----------------------------

    def toolexec_can_read_elsewhere(self) -> bool:
        """Whether another thread may read this channel's queues: not with kombu's ack
        emulation (each message recorded as it is taken), a ``global_keyprefix``, or a
        ``can_consume`` Celery replaced (``worker_disable_prefetch``)."""
        return not (self.ack_emulation or self.global_keyprefix or "can_consume" in vars(self.qos))

    def toolexec_read_on_loop(self, wake: Callable[[], None]) -> None:
        """From now on the channel sends no read of its own: the asyncio pool's reader
        reads its queues and hands it each read (:meth:`toolexec_deliver_read`); ``wake``
        tells the reader that the queues consumed changed."""
        self._toolexec_reader = wake
        wake()

    def basic_consume(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        consumer_tag = super().basic_consume(queue, *args, **kwargs)  # type: ignore[no-untyped-call]
        if self._toolexec_reader is not None:
            self._toolexec_reader()
        return consumer_tag

    def toolexec_read_lists(self) -> list[str]:
        """The lists a read takes from, in the order of kombu's fair queue cycle (the one
        a read took from last comes last)."""
        queues = self._queue_cycle.consume(len(self.active_queues))
        return [self._q_for_pri(queue, pri) for pri in self.priority_steps for queue in queues]  # type: ignore[no-untyped-call]

    def toolexec_deliver_read(self, popped_from: str, items: Sequence[bytes]) -> None:
        """Deliver the items a read popped from the list ``popped_from``, as a read of the
        channel's own (:meth:`_blmpop_read`)."""
        dest = popped_from.rsplit(self.sep, 1)[0]
        self._queue_cycle.rotate(dest)
        self._deliver_items(items, dest, popped_from)

    def toolexec_put_back_unread(self, items: Sequence[bytes], popped_from: str) -> None:
        """Put back items a read popped and never handed over (:meth:`PutBacks.put_back_unread`)."""
        self.put_backs.put_back_unread(items, popped_from)

    def _batch_size(self) -> int:
        """How many messages the next read may take (1: kombu's one ``BRPOP``)."""
        if self.ack_emulation or self.global_keyprefix or not self._toolexec_blmpop:
            return 1
        if "can_consume" in vars(self.qos):
            # Celery's worker_disable_prefetch replaces the channel's can_consume with a
            # check of the pool's free slots, which only one message per read respects.
            return 1
        room = self.qos.can_consume_max_estimate()
        return BATCH_MAX if room is None else max(1, min(int(room), BATCH_MAX))

    def _blmpop_read(self, **options: Any) -> bool:
        """Read the reply of ``BLMPOP`` and deliver its messages, as ``_brpop_read`` does one."""
        try:
            try:
                reply = self.client.parse_response(self.client.connection, "BLMPOP", **options)
            except self.connection_errors:
                # As kombu: disconnect, so the next iteration reconnects.
                self.client.connection.disconnect()
                raise
            except redis.ResponseError as exc:  # an unknown command, or an ACL without it
                self._toolexec_blmpop = False
                logger.warning(
                    "the broker refused BLMPOP (%s): reading one message per BRPOP",
                    str(exc).split("\n", 1)[0][:200],
                )
                raise Empty() from None
            if not reply:
                raise Empty()
            popped_from, items = reply
            popped_from = bytes_to_str(popped_from)  # type: ignore[no-untyped-call]
            dest = popped_from.rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(dest)
            self._deliver_items(items, dest, popped_from)
            return True
        finally:
            self._in_poll = None  # type: ignore[assignment]
            self._flush_brpop_reauth()  # type: ignore[no-untyped-call]

    def _deliver_items(self, items: Sequence[bytes], queue: str, popped_from: str) -> None:
        """Deliver each item of ``queue`` in turn; if one raises, put the items after it back.

        Until its turn, an item is named by :func:`in_hand`: on the solo pool each call
        runs as it is delivered, so the items after it wait here as long as it runs.
        """
        key = id(self)
        try:
            for index, item in enumerate(items):
                _in_hand[key] = (items, index)
                try:
                    self._deliver_item(item, queue)
                except BaseException:
                    self.put_backs.put_back_unread(items[index + 1 :], popped_from)
                    raise
        finally:
            del _in_hand[key]

    def _deliver_item(self, item: bytes, queue: str) -> None:
        """Decode ``item`` and deliver it, or dead-letter it if it cannot be read."""
        payload = self._accept_item(item, queue)
        if payload is _REFUSED:
            return
        self._toolexec_delivering = (queue, item)
        try:
            self.connection._deliver(payload, queue)
        except RefusedItem as refused:
            self._refuse(refused.reason, queue, item, refused.detail)
        finally:
            self._toolexec_delivering = None

    def _accept_item(self, item: bytes, queue: str) -> Any:
        """The decoded item (any JSON value: a ``null`` item is refused later, as no
        envelope), or :data:`_REFUSED` after refusing it (too large, not UTF-8 JSON)."""
        limit = self.toolexec_max_item_bytes
        if limit is not None and len(item) > int(limit):
            self._refuse(Refusal.TOO_LARGE, queue, item, f"larger than {int(limit)} bytes")
            return _REFUSED
        try:
            return _envelope_loads(bytes_to_str(item))  # type: ignore[no-untyped-call]
        except Exception as exc:  # noqa: BLE001 - not UTF-8, not JSON, nested too deep: refused
            self._refuse(Refusal.NOT_JSON, queue, item, type(exc).__name__)
            return _REFUSED

    def _refuse(self, reason: Refusal, queue: str, item: bytes, detail: str) -> None:
        if self.toolexec_redis_url:
            dead_letter(
                redis_client_for_url(self.toolexec_redis_url, master=self.toolexec_sentinel_master),
                reason,
                queue=queue,
                payload=item,
                detail=detail,
            )
            return
        try:
            with self.conn_or_acquire() as client:
                dead_letter(client, reason, queue=queue, payload=item, detail=detail)
        except redis.RedisError:  # dead_letter never raises; acquiring may
            pass


#: The reads being delivered, by channel: their items, and the index of the one whose
#: turn it is (those before it were handed to Celery).
_in_hand: dict[int, tuple[Sequence[bytes], int]] = {}


def in_hand() -> list[str]:
    """The call ids of the messages this process popped from its queues and has not yet
    handed to Celery (read from the heartbeat's thread).

    The worker holds them as it holds a call waiting for a free process: its heartbeat
    names them (pid 0), so that the client's watchdog, which finds them neither queued
    nor held by a request, does not take them for lost.
    """
    call_ids = []
    for items, turn in list(_in_hand.values()):
        for item in items[turn:]:
            call_id = call_id_of(item)
            if call_id is not None:
                call_ids.append(call_id)
    return call_ids


#: The content type of a JSON body.
_JSON = "application/json"


def _envelope_loads(text: str) -> Any:
    """kombu's ``loads(text)``, without its per-object hook where it cannot apply.

    kombu's JSON hook turns an object whose keys are exactly ``__type__`` and
    ``__value__`` into the value it encodes (a datetime, a UUID); every other object
    stays as it is. Without the text ``__type__`` and without a ``\\u`` escape (which
    could spell it), no object has that key, and the standard library's decoder gives the
    same value without calling the hook once per object.
    """
    if "__type__" in text or "\\u" in text:
        return loads(text)  # type: ignore[no-untyped-call]
    return json.loads(text)


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with :class:`Channel`: ``broker_transport`` names it.

    A Redis out of memory (``maxmemory``, ``noeviction``) refuses every write, including
    the ones kombu makes as it connects (declaring the queues). kombu counts that refusal
    as a channel error, and Celery's consumer stops the worker on a channel error while it
    connects ("Unrecoverable error"): a worker started, or reconnecting after a break,
    while Redis was full died of it. Here it is a connection error, which Celery meets
    by connecting again until Redis takes writes.
    """

    Channel = Channel
    connection_errors = (
        *kombu_redis.Transport.connection_errors,
        redis.exceptions.OutOfMemoryError,
    )


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """:class:`Channel` on kombu's Sentinel channel: the same guarded, batched reads and
    put-backs, on connections kombu's Sentinel pool makes to the group's master (it asks
    the Sentinels again as each connection is made, so a failover is a broken connection
    that Celery's consumer makes again)."""

    from_transport_options = (  # type: ignore[assignment]  # kombu types its own tuple's length
        *Channel.from_transport_options,
        *(
            option
            for option in kombu_redis.SentinelChannel.from_transport_options
            if option not in Channel.from_transport_options
        ),
    )


class SentinelTransport(kombu_redis.SentinelTransport):
    """kombu's Sentinel transport with :class:`SentinelChannel` (a ``sentinel://`` broker),
    and a Redis out of memory a connection error, as for :class:`Transport`."""

    Channel = SentinelChannel
    connection_errors = Transport.connection_errors
