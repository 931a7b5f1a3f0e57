"""The consumer's bootstep that lets the asyncio pool read the queues on its own loop.

:mod:`executor.pools.reads` says why and how. This step, added to Celery's consumer
blueprint after its task consumer (``Tasks``), attaches the pool's reader to the task
consumer's channel as the consumer starts, and detaches it as the consumer stops or
restarts. Its consumer (:class:`executor.seams.consumer.Consumer`) also detaches it first
when the broker connection breaks, before Celery closes the channel and puts back what it
holds.

It reads on the loop only where every guarantee of the channel's own reads holds there
too: the asyncio pool, a Redis broker read by toolexec's channel
(:class:`executor.seams.transport.Channel`), without kombu's ack emulation, a
``global_keyprefix`` or ``worker_disable_prefetch``, and with ``TOOLEXEC_LOOP_READS`` on
(the default). Anywhere else Celery's consumer reads, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import bootsteps

from executor.seams.transport import Channel
from wire.settings import Settings

__all__ = ["LoopReads", "detach_reader"]

logger = logging.getLogger(__name__)


class LoopReads(bootsteps.StartStopStep):  # type: ignore[misc]
    """Consumer bootstep: the asyncio pool's loop reads the task queues (when it can)."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, c: Any) -> None:
        settings: Settings | None = getattr(c.app, "toolexec_settings", None)
        pool: Any = getattr(c, "pool", None)
        task_consumer = getattr(c, "task_consumer", None)
        channel = getattr(task_consumer, "channel", None)
        if (
            settings is None
            or not settings.loop_reads
            or not callable(getattr(pool, "read_queues", None))
            or not isinstance(channel, Channel)
            or not channel.toolexec_can_read_elsewhere()
        ):
            return
        detach: Callable[[], None] = pool.read_queues(
            channel, url=settings.broker_url, master=settings.sentinel_master
        )
        c.toolexec_detach_reader = detach
        channel.toolexec_read_on_loop(pool.wake_reader)
        logger.debug("the asyncio pool reads the task queues on its loop")

    def stop(self, c: Any) -> None:
        detach_reader(c)

    def shutdown(self, c: Any) -> None:
        detach_reader(c)


def detach_reader(c: Any) -> None:
    """Stop handing reads to the consumer ``c``'s channel; return once none is being handed
    over (nothing, where the consumer reads itself)."""
    detach = getattr(c, "toolexec_detach_reader", None)
    if detach is not None:
        c.toolexec_detach_reader = None
        detach()
