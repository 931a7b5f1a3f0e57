"""The tool of the benchmark's toolexec worker over RabbitMQ (``--broker amqp``).

The run's RabbitMQ queue is unique to it (:class:`bench.amqp.AmqpQueues`), and a tool's
queue is part of its registration, so this module registers ``noop`` on the queue named
by ``BENCH_AMQP_QUEUE``, which the benchmark sets for its worker. Only the worker
imports it (``TOOLEXEC_TOOL_MODULES=bench.amqp_tools``).
"""

from __future__ import annotations

import os

from bench.amqp import QUEUE_VARIABLE
from executor import tool

__all__ = ["noop"]

if not os.environ.get(QUEUE_VARIABLE):
    raise RuntimeError(f"{QUEUE_VARIABLE} must name the run's RabbitMQ queue")


@tool(queue=os.environ[QUEUE_VARIABLE])
def noop() -> None:
    """Do nothing and return at once; the round trip is what is measured."""
