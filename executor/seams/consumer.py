"""Celery's consumer, refusing every message it cannot run: dead-lettered, never logged.

Celery's consumer hands each message to the task's strategy and request. It has a
hook for each kind of message it rejects (``on_decode_error``, ``on_unknown_message``,
``on_unknown_task``, ``on_invalid_task``), and the stock hooks log the message's body.
Anything else that goes wrong while the main process takes a message (a header of the
wrong type, a body that is not ``[args, kwargs, embed]``) escapes the event loop and
stops the worker. This consumer, selected through Celery's ``worker_consumer`` setting
(:mod:`executor.seams.app`):

* refuses a message without a protocol-2 task header before Celery looks at it;
* implements the four hooks: dead-letter the message (:mod:`executor.seams.deadletter`),
  acknowledge it so it is never delivered again, with or without ack emulation, and
  log the reason without the payload;
* wraps the task handler Celery builds (``create_task_handler``) so that an exception
  it does not handle refuses the message too, instead of stopping the worker.
  Connection errors still propagate: Celery reconnects on them.

The task's request (:mod:`executor.seams.request`) turns a malformed toolexec call into
Celery's ``InvalidTaskError``, which arrives here through ``on_invalid_task``.

It also connects again sooner after losing its broker (:meth:`Consumer.ensure_connected`):
kombu's pauses between attempts, 2 s growing to 30 s, kept a worker away for seconds after
its Redis was back, or after Sentinel had promoted a new master.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from celery import signals
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu.exceptions import ContentDisallowed

from executor.seams.deadletter import Refusal, describe, refuse_message
from executor.seams.loop_reads import detach_reader
from executor.seams.request import MalformedCall, StartedBefore
from executor.worker import redis_client

__all__ = ["Consumer"]

logger = logging.getLogger(__name__)

#: Seconds between the consumer's attempts to connect to its broker again: the first
#: pause, how much each next one grows, the longest (kombu's: 2, 2 and 30). A failover
#: or a restart of Redis takes seconds; each attempt is one connection, refused at once
#: while the server is away.
RECONNECT_FIRST = 0.25
RECONNECT_STEP = 0.25
RECONNECT_MAX = 2.0


class Consumer(CeleryConsumer):  # type: ignore[misc]
    """Celery's consumer that refuses a message it cannot run instead of dying on it."""

    def ensure_connected(self, conn: Any) -> Any:
        """Celery's, with toolexec's pauses between attempts (:data:`RECONNECT_FIRST`,
        :data:`RECONNECT_STEP`, :data:`RECONNECT_MAX`) instead of kombu's defaults, which
        Celery's consumer does not set."""
        conn.ensure_connection = functools.partial(
            conn.ensure_connection,
            interval_start=RECONNECT_FIRST,
            interval_step=RECONNECT_STEP,
            interval_max=RECONNECT_MAX,
        )
        try:
            return super().ensure_connected(conn)
        finally:
            del conn.ensure_connection  # the connection's own method again

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        """Celery's, after the asyncio pool's reader stopped handing reads to the channel
        (:mod:`executor.seams.loop_reads`): Celery closes it now, putting back what it holds."""
        detach_reader(self)
        super().on_connection_error_after_connected(exc)

    def call_soon_ack(self, p: Any, *args: Any, **kwargs: Any) -> Any:
        """Celery's, but while the asyncio pool's loop reads the queues, an acknowledgement
        is made where it is asked, not handed to this thread's event loop: without kombu's
        ack emulation it only marks the message done in the channel's memory, and handing it
        over woke this thread once per call."""
        if getattr(self, "toolexec_detach_reader", None) is None:
            return super().call_soon_ack(p, *args, **kwargs)
        try:
            p(*args, **kwargs)
        except Exception:  # as Celery's own immediate path: logged, never raised
            logger.exception("an acknowledgement failed")
        return p

    def on_close(self) -> None:
        """Celery's, once the asyncio pool's reader hands nothing more to the closing channel."""
        detach_reader(self)
        super().on_close()

    def create_task_handler(self, *args: Any, **kwargs: Any) -> Callable[[Any], None]:
        """Celery's task handler, refusing what it would raise on."""
        handle = super().create_task_handler(*args, **kwargs)
        reraise = tuple(self.connection_errors or ()) + tuple(self.channel_errors or ())

        def on_task_received(message: Any) -> None:
            headers = getattr(message, "headers", None)
            if not isinstance(headers, dict) or not isinstance(headers.get("task"), str):
                self._refuse(message, Refusal.NOT_A_TASK, "no protocol 2 task header")
                return
            try:
                handle(message)
            except reraise:
                raise
            except Exception as exc:  # noqa: BLE001 - any other failure refuses the message
                self._refuse(message, Refusal.UNHANDLED, describe(exc))

        return on_task_received

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        """The body does not decode as its content type and encoding say."""
        reason = (
            Refusal.CONTENT_DISALLOWED
            if isinstance(exc, ContentDisallowed)
            else Refusal.UNDECODABLE
        )
        self._refuse(message, reason, describe(exc))

    def on_unknown_message(self, body: Any, message: Any) -> None:
        """A message that is no task message Celery knows."""
        self._refuse(message, Refusal.NOT_A_TASK, "not a task message")
        signals.task_rejected.send(sender=self, message=message, exc=None)

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        """A task name this worker does not serve."""
        self._refuse(message, Refusal.UNKNOWN_TASK, "a task this worker does not serve")
        signals.task_rejected.send(sender=self, message=message, exc=exc)

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        """A task message Celery, or toolexec's request, cannot read."""
        if isinstance(exc, MalformedCall):
            self._refuse(message, Refusal.INVALID_CALL, str(exc))
        elif isinstance(exc, StartedBefore):
            self._refuse(message, Refusal.WORKER_LOST, str(exc))
        elif isinstance(exc, ContentDisallowed):
            self._refuse(message, Refusal.CONTENT_DISALLOWED, describe(exc))
        else:
            self._refuse(message, Refusal.INVALID_TASK, describe(exc))
        signals.task_rejected.send(sender=self, message=message, exc=exc)

    def _refuse(self, message: Any, reason: Refusal, detail: str) -> None:
        refuse_message(message, reason, detail, client=redis_client(self.app.toolexec_settings))
        if not message.acknowledged:
            message.reject_log_error(logger, self.connection_errors)
