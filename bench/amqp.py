"""The benchmark over RabbitMQ (``python -m bench --broker amqp``): its queues and its server.

With ``--broker amqp`` toolexec's calls and plain Celery's tasks travel over the
machine's RabbitMQ, while toolexec's catalog, replies and idempotency records and
Celery's results stay in the run's private Redis. RabbitMQ is shared with others, so
the run's queues carry a token of their own (:class:`AmqpQueues`) and are deleted,
with the exchange plain Celery declares for its queue, when the run ends; nothing else
on the server is touched. The sequential and throughput scenarios (1 and 2) run over
it: the others measure what the broker does not change (deadlines, threads, the
cache) or read Redis queue lengths.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass, field
from typing import Any

from kombu.connection import Connection

__all__ = ["AMQP_SCENARIOS", "AMQP_URL", "QUEUE_VARIABLE", "AmqpQueues", "rabbitmq_version"]

#: The machine's RabbitMQ.
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"
#: The scenarios a run over RabbitMQ makes (sequential round trip, throughput).
AMQP_SCENARIOS = (1, 2)
#: The environment variable that gives the toolexec worker its queue (:mod:`bench.amqp_tools`).
QUEUE_VARIABLE = "BENCH_AMQP_QUEUE"


def _connection(url: str) -> Any:
    return Connection(url, connect_timeout=5)  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class AmqpQueues:
    """The queues of one run on RabbitMQ, unique to it."""

    url: str = AMQP_URL
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    @property
    def toolexec(self) -> str:
        """The toolexec worker's queue (its tools are registered on it)."""
        return f"bench_amqp_{self.token}"

    @property
    def raw(self) -> str:
        """Plain Celery's queue (and the exchange Celery names after it)."""
        return f"bench_amqp_raw_{self.token}"

    @property
    def raw_prefetch1(self) -> str:
        """The queue (and exchange) of plain Celery's worker with prefetch multiplier 1."""
        return f"bench_amqp_raw1_{self.token}"

    def delete(self) -> None:
        """Delete this run's queues and plain Celery's exchange; absent ones are skipped."""
        with _connection(self.url) as connection:
            for name in (self.toolexec, self.raw, self.raw_prefetch1):
                channel = connection.channel()
                with contextlib.suppress(*connection.channel_errors):
                    channel.queue_delete(name)
                    channel.close()
            for name in (self.raw, self.raw_prefetch1):
                channel = connection.channel()
                with contextlib.suppress(*connection.channel_errors):
                    channel.exchange_delete(name)
                    channel.close()


def rabbitmq_version(url: str = AMQP_URL) -> str:
    """The server's version, as it announces itself."""
    with _connection(url) as connection:
        connection.connect()
        version = connection.connection.server_properties.get("version", "?")
    return version.decode() if isinstance(version, bytes) else str(version)
