"""The asyncio pool's I/O threads: steps queued together run together, each gets its own result.

Steps queued with ``Offload.batched`` for one function while a lane is busy reach that
function as one list (the outcome pushes of many calls then share one Redis pipeline);
an exception a batched function hands back for one item fails that item's step only.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from executor.pools.offload import IOLanes


def test_steps_queued_while_a_lane_is_busy_reach_their_batched_function_together() -> None:
    batches: list[list[int]] = []
    busy = threading.Event()
    release = threading.Event()

    def block() -> str:
        busy.set()
        release.wait(5)
        return "blocked"

    def double(items: list[int]) -> list[int | BaseException]:
        batches.append(items)
        return [ValueError(f"odd {i}") if i % 2 else i * 2 for i in items]

    async def main() -> None:
        lanes = IOLanes(1)
        lanes.start(asyncio.get_running_loop())
        try:
            blocked = lanes(block)
            await asyncio.to_thread(busy.wait, 5)
            steps = [lanes.batched(double, i) for i in range(4)]
            release.set()
            assert await blocked == "blocked"
            results = await asyncio.gather(*steps, return_exceptions=True)
        finally:
            await asyncio.to_thread(lanes.stop)
        assert batches == [[0, 1, 2, 3]]
        assert results[0] == 0 and results[2] == 4
        assert isinstance(results[1], ValueError) and str(results[1]) == "odd 1"
        assert isinstance(results[3], ValueError)

    asyncio.run(main())


def test_a_batched_function_that_raises_fails_every_step_of_its_batch() -> None:
    def broken(items: list[int]) -> list[int | BaseException]:
        raise RuntimeError("redis is gone")

    async def main() -> None:
        lanes = IOLanes(1)
        lanes.start(asyncio.get_running_loop())
        try:
            with pytest.raises(RuntimeError, match="redis is gone"):
                await lanes.batched(broken, 1)
            assert await lanes(lambda: 7) == 7
        finally:
            await asyncio.to_thread(lanes.stop)

    asyncio.run(main())


def test_an_outcome_is_delivered_while_the_step_lanes_wait_on_redis() -> None:
    # Admissions tried again while Redis refuses writes hold the step lanes (a lane runs
    # the steps it took one after another); a call that has run must still have its
    # outcome sent, on the delivery lane.
    release = threading.Event()
    entered = threading.Event()

    def begin_patiently() -> str:
        entered.set()
        release.wait(10)
        return "begun"

    async def main() -> None:
        lanes = IOLanes(1)
        lanes.start(asyncio.get_running_loop())
        try:
            waiting = [lanes(begin_patiently), lanes(begin_patiently)]
            await asyncio.to_thread(entered.wait, 5)  # the step lane is taken
            push = lanes.deliver_batched(lambda items: [f"sent {i}" for i in items], 1)
            sent = await asyncio.wait_for(push, 5)
            alone = await asyncio.wait_for(lanes.deliver(lambda: "sent"), 5)
            assert not any(step.done() for step in waiting)
            release.set()
            assert await asyncio.gather(*waiting) == ["begun", "begun"]
        finally:
            release.set()
            await asyncio.to_thread(lanes.stop)
        assert (sent, alone) == ("sent 1", "sent")

    asyncio.run(main())
