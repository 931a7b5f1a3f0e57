"""Publish calls to RabbitMQ through kombu, from one publisher thread per process.

With an ``amqp://`` (``amqps://``, ``pyamqp://``) ``TOOLEXEC_BROKER_URL`` calls travel
over AMQP, while the catalog, the replies and the idempotency records stay in Redis
(``TOOLEXEC_REDIS_URL``, required then). The :class:`~agent_client._io.send.Publisher`
gives the broker's lane an :class:`AmqpLane` instead of a Redis lane:

* **the message** is the one ``app.send_task`` publishes for the worker's app
  (:mod:`executor.seams.app`): the protocol 2 headers and body the Redis path writes
  (:mod:`wire.message`), ``application/json`` in ``utf-8``, persistent, priority 0,
  ``correlation_id`` the call id, ``reply_to`` the client id, ``expiration`` the
  milliseconds left to Celery's ``expires``, published to the nameless exchange with
  the tool's queue as routing key, after declaring the queue as the worker declares it
  (:func:`queue_entity`), so a call to a queue no worker has declared yet waits in it.
  ``tests/contract/test_amqp_envelope.py`` compares it with ``send_task``'s;
* **publisher confirms**: the channel is in confirm mode, so a call counts as sent
  only once RabbitMQ acknowledged it. A batch is published whole, then its
  confirmations are awaited together: kombu's ``confirm_publish`` transport option
  waits for each message in turn, and a persistent message is confirmed after an fsync,
  so it costs milliseconds per call where a batch costs one wait;
* **one thread**: kombu blocks, so every connect, publish and wait runs on the lane's
  single-thread executor (one thread per process and broker), driven by the client's
  I/O thread with ``loop.run_in_executor``. Neither an async caller's event loop nor
  the I/O thread (replies, watchdog) ever waits on RabbitMQ; a sync caller waits on
  its future as on the Redis path, so only its deadline ends its wait.

What a call's caller hears follows how far its publish got
(:class:`~agent_client._io.callstate.CallState`): a connection that could not be made, or
a message RabbitMQ refused (``basic.nack``), was provably not sent and is sent again,
with backoff, until the deadline (then ``BrokerUnavailable``). A publish whose
confirmation never came (the connection failed after the write) may have been queued:
an at-least-once call is published again, an at-most-once call is not (RabbitMQ
cannot tell a second copy from the first), and its caller waits for its outcome until
the deadline (then ``ToolOutcomeUnknown``). An idempotent call is claimed in Redis
first and published after; a claim whose publish never went out is released
(:mod:`agent_client._io.send`).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import concurrent.futures
import functools
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import amqp.exceptions  # type: ignore[import-untyped]  # py-amqp, kombu's AMQP client
import kombu.exceptions
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.messaging import Producer

from agent_client._io.callstate import OP_TIMEOUT, Send, op_timeout
from agent_client._io.link import NotSent
from wire.clock import shared_now

logger = logging.getLogger(__name__)

#: The exchange the worker's app binds every queue to: Celery names its default
#: exchange after ``task_default_queue``, which :mod:`executor.seams.app` sets to
#: ``"default"``.
DEFAULT_EXCHANGE = "default"
#: The name of the publisher thread.
THREAD_NAME = "toolexec-amqp"

#: Seconds RabbitMQ may take to confirm a batch once it is written. A persistent message
#: is confirmed after its fsync, which a loaded disk makes slow: a confirmation that
#: comes late still confirms, and only a connection that stays silent this long counts
#: as failed (its batch's fate unknown). Callers do not wait for it: their deadlines hold.
_CONFIRM_TIMEOUT = 10.0
#: Seconds one socket read or write may block: RabbitMQ stops reading from publishers
#: under a resource alarm, and a frozen broker answers nothing (a declare, a close).
_SOCKET_TIMEOUT = 2.0
#: What kombu and py-amqp raise when a connection or a channel fails.
_AMQP_ERRORS = (kombu.exceptions.KombuError, amqp.exceptions.AMQPError, OSError)


def queue_entity(name: str) -> Queue:
    """The queue ``name`` as the worker's app declares it (durable, on the default exchange)."""
    return Queue(name, Exchange(DEFAULT_EXCHANGE, "direct"), routing_key=name)  # type: ignore[no-untyped-call]


@dataclass(frozen=True, slots=True)
class AmqpMessage:
    """One call's AMQP message: what ``send_task`` would publish for it.

    Attributes:
        queue: The tool's queue (the routing key).
        body: The protocol 2 body, JSON.
        headers: The protocol 2 headers.
        correlation_id: The call id.
        reply_to: The client id.
        expires_at: Celery's ``expires`` in epoch seconds, or None.
    """

    queue: str
    body: bytes
    headers: dict[str, Any]
    correlation_id: str
    reply_to: str
    expires_at: float | None

    def expiration(self) -> float | None:
        """Seconds left to ``expires`` (RabbitMQ's per-message TTL), as ``send_task`` sets it."""
        if self.expires_at is None:
            return None
        return max(0.0, self.expires_at - shared_now())


def amqp_message(envelope: str) -> AmqpMessage:
    """The AMQP message of a call, read from its Redis envelope
    (:func:`wire.message.redis_envelope`)."""
    data = json.loads(envelope)
    properties = data["properties"]
    headers: dict[str, Any] = data["headers"]
    expires = headers.get("expires")
    return AmqpMessage(
        queue=properties["delivery_info"]["routing_key"],
        body=base64.b64decode(data["body"]),
        headers=headers,
        correlation_id=properties["correlation_id"],
        reply_to=properties["reply_to"],
        expires_at=None if expires is None else datetime.fromisoformat(expires).timestamp(),
    )


#: How one publish ended: confirmed by RabbitMQ, refused by it (``basic.nack``), maybe
#: queued (written, not confirmed), or not written at all.
Fate = Literal["confirmed", "nacked", "unknown", "unsent"]


@dataclass(frozen=True, slots=True)
class Published:
    """The fate of one message of a batch, and why it was not confirmed."""

    fate: Fate
    error: str = ""


class AmqpChannel:
    """One connection to RabbitMQ and one channel in confirm mode; one thread uses it.

    Args:
        url: The broker's URL.
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self._connection: Connection | None = None
        self._channel: Any = None
        self._producer: Producer | None = None
        self._declared: set[str] = set()
        self._sequence = 0
        self._pending: collections.OrderedDict[int, int] = collections.OrderedDict()
        self._fates: list[Published | None] = []

    # -- connection ------------------------------------------------------------------

    def connect(self, timeout: float) -> None:
        """Make sure the connection and its channel are up, publishing nothing.

        Raises:
            NotSent: No connection within ``timeout``, or RabbitMQ refused it.
        """
        if self._connection is not None and self._usable():
            return
        self.close()
        connection = Connection(  # type: ignore[no-untyped-call]
            self._url,
            connect_timeout=max(0.05, timeout),
            heartbeat=0,
            transport_options={"read_timeout": _SOCKET_TIMEOUT, "write_timeout": _SOCKET_TIMEOUT},
        )
        try:
            connection.ensure_connection(max_retries=0)  # type: ignore[no-untyped-call]  # one attempt
            channel = connection.channel()  # type: ignore[no-untyped-call]
            channel.confirm_select()
        except _AMQP_ERRORS as exc:
            _close_quietly(connection)
            raise NotSent(_describe(exc)) from exc
        channel.events["basic_ack"].add(self._on_ack)
        channel.events["basic_nack"].add(self._on_nack)
        self._connection, self._channel = connection, channel
        self._producer = Producer(channel, auto_declare=False)  # type: ignore[no-untyped-call]
        self._declared, self._sequence = set(), 0

    def _usable(self) -> bool:
        # A connection the server closed (a restart) is made again before anything is
        # written on it, so that a batch sent on it does not count as maybe queued.
        connection = self._connection
        if connection is None or not connection.connected:
            return False
        try:
            connection.drain_events(timeout=0)  # type: ignore[no-untyped-call]
        except TimeoutError:
            return True  # nothing to read: it is up
        except _AMQP_ERRORS:
            return False
        return self._channel is not None and bool(getattr(self._channel, "is_open", True))

    def close(self, *, politely: bool = False) -> None:
        """Close the connection, if any; ``politely``: with AMQP's goodbye (when stopping).

        A broken connection is dropped without one.
        """
        connection, self._connection = self._connection, None
        self._channel = self._producer = None
        if connection is not None:
            _close_quietly(connection, politely=politely)

    # -- publishing -----------------------------------------------------------------

    def publish(
        self, envelopes: list[str], confirm_timeout: float = _CONFIRM_TIMEOUT
    ) -> list[Published]:
        """Publish one message per envelope, then wait up to ``confirm_timeout`` for confirmations.

        Call after :meth:`connect`. Never raises for a broker's failure: each message's
        fate is in the list, in order.
        """
        fates: list[Published | None] = [None] * len(envelopes)
        self._fates, self._pending = fates, collections.OrderedDict()
        producer = self._producer
        assert producer is not None, "publish before connect"
        for index, envelope in enumerate(envelopes):
            try:
                message = amqp_message(envelope)
            except (ValueError, KeyError, TypeError) as exc:  # not toolexec's envelope: a bug
                fates[index] = Published(
                    "unsent", f"the call's message does not decode ({type(exc).__name__})"
                )
                continue
            try:
                self._declare(message.queue)
                producer.publish(  # type: ignore[no-untyped-call]
                    message.body,
                    exchange="",
                    routing_key=message.queue,
                    headers=message.headers,
                    content_type="application/json",
                    content_encoding="utf-8",
                    delivery_mode=2,
                    priority=0,
                    correlation_id=message.correlation_id,
                    reply_to=message.reply_to,
                    expiration=message.expiration(),
                )
            except _AMQP_ERRORS as exc:
                # The failed write may have gone out in part (unknown); nothing after it did.
                why = _describe(exc)
                self.close()
                fates[index] = Published(
                    "unknown", f"the connection to RabbitMQ failed while publishing: {why}"
                )
                for later in range(index + 1, len(fates)):
                    if fates[later] is None:
                        fates[later] = Published(
                            "unsent", f"the connection to RabbitMQ failed: {why}"
                        )
                return self._unconfirmed(
                    fates, f"the connection to RabbitMQ failed while publishing: {why}"
                )
            self._sequence += 1
            self._pending[self._sequence] = index
        return self._await_confirms(fates, time.monotonic() + confirm_timeout)

    def _declare(self, queue: str) -> None:
        if queue not in self._declared:
            queue_entity(queue)(self._channel).declare()  # type: ignore[no-untyped-call]
            self._declared.add(queue)

    def _await_confirms(self, fates: list[Published | None], ends: float) -> list[Published]:
        connection = self._connection
        assert connection is not None
        while self._pending:
            left = ends - time.monotonic()
            if left <= 0:
                self.close()  # in an unknown state: the next batch starts afresh
                return self._unconfirmed(fates, "RabbitMQ did not confirm the publish in time")
            try:
                connection.drain_events(timeout=left)  # type: ignore[no-untyped-call]
            except TimeoutError:
                continue
            except _AMQP_ERRORS as exc:
                self.close()
                return self._unconfirmed(
                    fates,
                    f"the connection to RabbitMQ failed before it confirmed: {_describe(exc)}",
                )
        return [fate or Published("unknown", "no confirmation") for fate in fates]

    def _unconfirmed(self, fates: list[Published | None], why: str) -> list[Published]:
        for index in self._pending.values():
            fates[index] = Published("unknown", why)
        self._pending.clear()
        return [fate or Published("unknown", why) for fate in fates]

    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        self._settle(delivery_tag, multiple, Published("confirmed"))

    def _on_nack(self, delivery_tag: int, multiple: bool) -> None:
        self._settle(
            delivery_tag, multiple, Published("nacked", "RabbitMQ refused the message (basic.nack)")
        )

    def _settle(self, delivery_tag: int, multiple: bool, fate: Published) -> None:
        if not multiple:
            index = self._pending.pop(delivery_tag, None)
            if index is not None:
                self._fates[index] = fate
            return
        while self._pending:
            tag, index = next(iter(self._pending.items()))
            if tag > delivery_tag:
                break
            del self._pending[tag]
            self._fates[index] = fate


def _close_quietly(connection: Connection, *, politely: bool = False) -> None:
    try:
        if politely:
            connection.release()  # type: ignore[no-untyped-call]  # bounded by the socket timeout
        else:
            connection.collect(socket_timeout=0.1)  # type: ignore[no-untyped-call]  # no round trip
    except Exception as exc:  # noqa: BLE001 - closing what failed must not fail
        logger.debug("closing a connection to RabbitMQ failed: %s", type(exc).__name__)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError) and not str(exc):
        return "timed out"
    return str(exc) or type(exc).__name__


class AmqpLane:
    """The RabbitMQ half of a :class:`~agent_client._io.send.SendLane`: publishes with
    confirms. Lives on the client's I/O thread; its blocking work runs on its own
    single thread.

    Args:
        url: The broker's URL.
    """

    broker = "RabbitMQ"

    def __init__(self, url: str) -> None:
        self._channel = AmqpChannel(url)
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=THREAD_NAME)

    async def close(self) -> None:
        """Close the connection, once the lane has stopped (on the I/O thread)."""
        closing = asyncio.get_running_loop().run_in_executor(
            self._executor, functools.partial(self._channel.close, politely=True)
        )
        try:
            await asyncio.wait_for(closing, OP_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - a close that fails leaves nothing to do
            logger.debug("closing the connection to RabbitMQ failed: %s", type(exc).__name__)
        self._executor.shutdown(wait=False)

    async def _blocking(self, work: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, work, *args)

    async def connect(self, queued: Sequence[Send]) -> None:
        """Make sure the connection is up, within what ``queued`` have left (raises ``NotSent``)."""
        await self._blocking(self._channel.connect, op_timeout(queued))

    async def send(self, batch: list[Send]) -> tuple[list[Send], bool]:
        """Publish ``batch`` once; ``(sends to publish again, whether to back off first)``."""
        try:
            fates = await self._blocking(
                self._channel.publish, [item.call.envelope for item in batch]
            )
        except Exception as exc:  # noqa: BLE001 - a bug must not stop every later send
            logger.error(
                "publishing a batch of %d calls failed: %s", len(batch), type(exc).__name__
            )
            fates = [Published("unknown", type(exc).__name__)] * len(batch)
        return self._settle(batch, fates)

    def _settle(self, batch: list[Send], fates: list[Published]) -> tuple[list[Send], bool]:
        """Apply each publish's fate; ``(sends to publish again, whether to back off)``."""
        again: list[Send] = []
        failed = False
        for item, fate in zip(batch, fates, strict=True):
            if fate.fate == "confirmed":
                item.state.confirm()
                continue
            item.state.last_error = fate.error
            failed = True
            if fate.fate in ("unsent", "nacked"):
                item.state.untake()  # provably not queued: safe to publish again
                again.append(item)
            elif item.call.spec.delivery == "at_least_once":
                again.append(item)  # maybe queued: a second copy is allowed
            # An at-most-once call maybe queued is not published again: its caller waits.
        return again, failed
