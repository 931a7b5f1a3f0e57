"""kombu's Redis transport, refusing a queue item it cannot read instead of dying on it.

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

The channel composes two more differences, each a module of its own: one wake-up
takes many messages (``BLMPOP`` within prefetch, :mod:`executor.seams.batched_read`),
and the messages taken but not started when the broker connection breaks are put
back, once, while Redis is away (:mod:`executor.seams.put_back`).

Only the worker's path is guarded: ``basic_get`` (``Channel._get``), which a worker
never uses, still decodes as kombu does.
"""

from __future__ import annotations

import json
import logging
from queue import Empty
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads

from executor.seams.batched_read import BatchedRead
from executor.seams.deadletter import Refusal, dead_letter, describe
from executor.worker import redis_client_for_url

__all__ = [
    "BROKER_URL_OPTION",
    "MAX_ITEM_OPTION",
    "REDIS_URL_OPTION",
    "Channel",
    "Message",
    "RefusedItem",
    "Transport",
    "envelope_problem",
]

#: Transport option: the Redis that holds toolexec's keys (the dead-letter list).
REDIS_URL_OPTION = "toolexec_redis_url"
#: Transport option: the largest item, in bytes, a worker reads from a queue.
MAX_ITEM_OPTION = "toolexec_max_item_bytes"
#: Transport option: the broker's URL, for putting messages back after the channel's
#: own connection is gone (:meth:`executor.seams.put_back.PutBack._restore`).
BROKER_URL_OPTION = "toolexec_broker_url"

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


class Channel(BatchedRead):
    """kombu's Redis channel that refuses an item it cannot read instead of raising.

    With the batched read (:class:`~executor.seams.batched_read.BatchedRead`) and the
    put-backs (:class:`~executor.seams.put_back.PutBack`) it is built on.
    """

    Message = Message
    from_transport_options = (  # type: ignore[assignment]  # kombu types its own tuple's length
        *kombu_redis.Channel.from_transport_options,
        REDIS_URL_OPTION,
        MAX_ITEM_OPTION,
        BROKER_URL_OPTION,
    )

    toolexec_redis_url: str | None = None
    toolexec_max_item_bytes: int | None = None
    _toolexec_delivering: tuple[str, bytes] | None = None

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
                redis_client_for_url(self.toolexec_redis_url),
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
