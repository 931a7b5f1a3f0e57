"""How many calls each scenario makes: the full run and the CI smoke run."""

from __future__ import annotations

from dataclasses import dataclass

from toolexec import Pool

__all__ = ["FULL", "SMOKE", "Sizes"]


@dataclass(frozen=True, kw_only=True)
class Sizes:
    """Sample sizes; every timed scenario alternates its sides over ``rounds`` blocks.

    Attributes:
        name: ``"full"`` or ``"smoke"``.
        rounds: A B A B rounds of the round-trip and cache-hit scenarios.
        warmup: Unrecorded calls each side makes before its first block.
        roundtrip_calls: Sequential calls per block (scenario 1).
        in_flight: Concurrency levels of the throughput scenario (2).
        throughput_rounds: A B A B rounds of scenario 2.
        throughput_calls: Calls per block at least.
        throughput_per_lane: Calls per block per call in flight, at least.
        thread_calls: Calls in flight, then timed out, in scenario 3.
        deadlines: Deadlines in seconds of scenario 4.
        deadline_rounds: A B A B rounds of scenario 4.
        deadline_samples: Calls per deadline per block.
        idempotent_pairs: First call and repeat pairs per block (scenario 5).
        shed_calls: Queued calls behind the busy worker (scenario 6).
        shed_pools: Pools scenario 6 measures.
        scale_rounds: Rounds of scenario 7.
        scale_calls: Calls per worker process per block (scenario 7).
        async_calls: Calls awaiting 1 s at once on one worker process (scenario 8).
        async_prefork_calls: Calls of scenario 8 on prefork ``-c 2``, extrapolated.
        command_calls: Calls per side and level whose Redis commands scenario 9 counts.
        command_in_flight: Calls in flight in scenario 9, one level per block.
        throughput_pool: A second pool scenario 2 measures toolexec on (None: none).
        throughput_pool_concurrency: Its ``-c``.
        peer_rounds: A B A B rounds of scenario 11 (the peers), sequential and at each level.
        peer_calls: Sequential calls per block (scenario 11).
        peer_in_flight: Concurrency levels of scenario 11.
        peer_block_calls: Calls per block at least, at each level.
        peer_per_lane: Calls per block per call in flight, at least.
        events_in_flight: Calls in flight in scenario 12 (task events on and off).
        events_rounds: A B A B rounds of scenario 12.
        events_calls: Calls per block of scenario 12.
        sizing_calls: Calls per block of scenario 15 (enough that the server's CPU time,
            counted by the OS in 10 ms ticks, is read to a few percent).
    """

    name: str
    rounds: int
    warmup: int
    roundtrip_calls: int
    in_flight: tuple[int, ...]
    throughput_rounds: int
    throughput_calls: int
    throughput_per_lane: int
    thread_calls: int
    deadlines: tuple[float, ...] = (0.05, 0.1, 1.0, 1.5)
    deadline_rounds: int
    deadline_samples: int
    idempotent_pairs: int
    shed_calls: int
    shed_pools: tuple[Pool, ...] = ("prefork", "solo", "threads", "asyncio")
    scale_rounds: int
    scale_calls: int
    async_calls: int
    async_prefork_calls: int
    command_calls: int
    command_in_flight: tuple[int, ...] = (1, 100)
    throughput_pool: Pool | None = "asyncio"
    throughput_pool_concurrency: int = 100
    peer_rounds: int
    peer_calls: int
    peer_in_flight: tuple[int, ...]
    peer_block_calls: int
    peer_per_lane: int
    events_in_flight: int = 100
    events_rounds: int = 3
    events_calls: int = 1000
    sizing_calls: int = 5000

    def throughput_block(self, in_flight: int) -> int:
        """Calls per block at ``in_flight`` calls in flight."""
        return max(self.throughput_calls, self.throughput_per_lane * in_flight)

    def peer_block(self, in_flight: int) -> int:
        """Calls per block of scenario 11 at ``in_flight`` calls in flight."""
        return max(self.peer_block_calls, self.peer_per_lane * in_flight)


FULL = Sizes(
    name="full",
    rounds=5,
    warmup=50,
    roundtrip_calls=400,
    in_flight=(1, 10, 100, 1000),
    throughput_rounds=3,
    throughput_calls=500,
    throughput_per_lane=3,
    thread_calls=1000,
    deadline_rounds=4,
    deadline_samples=5,
    idempotent_pairs=200,
    shed_calls=100,
    scale_rounds=3,
    scale_calls=50,
    async_calls=1000,
    async_prefork_calls=20,
    command_calls=1000,
    peer_rounds=3,
    peer_calls=400,
    peer_in_flight=(1, 10, 100, 1000),
    peer_block_calls=500,
    peer_per_lane=3,
)

SMOKE = Sizes(
    name="smoke",
    rounds=2,
    warmup=5,
    roundtrip_calls=20,
    in_flight=(1, 10, 100),
    throughput_rounds=1,
    throughput_calls=20,
    throughput_per_lane=1,
    thread_calls=100,
    deadline_rounds=1,
    deadline_samples=1,
    idempotent_pairs=10,
    shed_calls=20,
    # Two of the four pools: the scenario's code is the same for each, and every pool's
    # shedding is proved by tests/integration/test_pools.py (each pool here starts two
    # workers of its own, the smoke run's longest scenario).
    shed_pools=("prefork", "asyncio"),
    scale_rounds=1,
    scale_calls=5,
    async_calls=100,
    async_prefork_calls=4,
    command_calls=100,
    # A few hundred calls per peer: 20 sequential, 50 at 1 and 100 at 100 in flight.
    peer_rounds=1,
    peer_calls=20,
    peer_in_flight=(1, 100),
    peer_block_calls=50,
    peer_per_lane=1,
    events_rounds=1,
    events_calls=200,
    sizing_calls=200,
)
