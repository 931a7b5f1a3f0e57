"""One wake-up of the worker's channel takes many messages: ``BLMPOP`` within prefetch.

kombu sends one ``BRPOP`` per message, and each is a round trip and several system
calls in the worker's main process, which also runs Celery's consumer (on the asyncio
pool, every system call is then a wait for the GIL the loop thread holds).
:meth:`BatchedRead._brpop_start` sends ``BLMPOP ... RIGHT COUNT n`` instead (Redis 7.0):
it blocks like ``BRPOP`` and pops, from the first queue that has any, up to ``n``
messages in the same order ``BRPOP`` would. ``n`` is the room prefetch leaves
(``qos.can_consume_max_estimate()``, at most :data:`BATCH_MAX`), so the worker never
holds more than its prefetch count, and each message is delivered, one after another,
exactly as one from ``BRPOP`` (through the guarded decoding of
:class:`executor.seams.transport.Channel`). What changes is only the window between
popping a message and handing it to Celery, which now spans the messages of one read:

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
  (:meth:`~executor.seams.put_back.PutBack._put_back_unread`).

A server that refuses ``BLMPOP`` (older than 7.0, or an ACL without it) is read with
``BRPOP`` from then on, after one WARNING; so is a channel with a ``global_keyprefix``,
and one whose ``can_consume`` Celery replaced (``worker_disable_prefetch``: one message
whenever a pool slot is free).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from queue import Empty
from typing import TYPE_CHECKING, Any

import redis
from kombu.utils.encoding import bytes_to_str

from executor.seams.put_back import PutBack, call_id_of

__all__ = ["BATCH_MAX", "BatchedRead", "in_hand"]

#: Most messages one read (``BLMPOP``) takes; fewer when prefetch leaves less room. A
#: read's messages are handed to Celery one after another in one turn of the consumer's
#: event loop, so this bounds how long a turn lasts.
BATCH_MAX = 100

logger = logging.getLogger(__name__)


class BatchedRead(PutBack):
    """The batched read of toolexec's channel (:class:`executor.seams.transport.Channel`)."""

    #: False once the server refused ``BLMPOP``: read with ``BRPOP`` from then on.
    _toolexec_blmpop = True
    #: How many messages the read under way asked for; 0 while it is kombu's ``BRPOP``.
    _toolexec_asked = 0

    if TYPE_CHECKING:

        def _deliver_item(self, item: bytes, queue: str) -> None:
            """Decode one item and deliver it, or dead-letter it (the channel's own)."""

    def _brpop_start(self, timeout: int | None = None) -> None:
        """Wait for messages: ``BLMPOP`` for as many as prefetch leaves room for, else ``BRPOP``.

        kombu 5.7.0's ``Channel._brpop_start`` with another command; pinned by a test.
        """
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
                    self._put_back_unread(items[index + 1 :], popped_from)
                    raise
        finally:
            del _in_hand[key]


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
