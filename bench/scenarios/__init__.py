"""The scenarios of the benchmark, in the order the issues list them.

Each module has ``NUMBER``, ``TITLE`` and ``run(bench) -> ScenarioResult``.
"""

from __future__ import annotations

from typing import Protocol

from bench.harness import Bench
from bench.report import ScenarioResult
from bench.scenarios import (
    async_tools,
    deadlines,
    idempotency,
    loop_reads,
    peers,
    redis_commands,
    redis_sizing,
    replica_acks,
    roundtrip,
    run_log,
    scaling,
    shedding,
    signing,
    task_events,
    threads,
    throughput,
)

__all__ = ["SCENARIOS", "Scenario"]


class Scenario(Protocol):
    """What the runner needs of a scenario module."""

    NUMBER: int
    TITLE: str

    def run(self, bench: Bench) -> ScenarioResult: ...


SCENARIOS: tuple[Scenario, ...] = (
    roundtrip,
    throughput,
    threads,
    deadlines,
    idempotency,
    shedding,
    scaling,
    async_tools,
    redis_commands,
    signing,
    peers,
    task_events,
    replica_acks,
    loop_reads,
    redis_sizing,
    run_log,
)
