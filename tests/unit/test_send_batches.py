"""agent_client._io.send.LoopBatcher: the sends of one event-loop turn, handed over in chunks."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from agent_client._io.callstate import Send
from agent_client._io.send import _TURN_CHUNK, LoopBatcher, Publisher


def test_a_turn_that_starts_many_calls_hands_them_over_in_chunks_and_the_rest_at_its_end() -> None:
    handed: list[list[Send]] = []

    async def one_turn() -> list[int]:
        loop = asyncio.get_running_loop()
        batcher = LoopBatcher(loop, cast(Publisher, SimpleNamespace(send=handed.append)))
        sends = [cast(Send, object()) for _ in range(2 * _TURN_CHUNK + 7)]
        for send in sends:
            batcher.add(send)
        during = [len(batch) for batch in handed]
        await asyncio.sleep(0)  # the turn ends: the flush it scheduled runs
        assert [s for batch in handed for s in batch] == sends  # each once, in order
        return during

    during = asyncio.run(one_turn())

    assert during == [_TURN_CHUNK, _TURN_CHUNK]
    assert [len(batch) for batch in handed if batch] == [_TURN_CHUNK, _TURN_CHUNK, 7]


def test_a_turn_that_starts_few_calls_hands_them_over_together_at_its_end() -> None:
    handed: list[Any] = []

    async def one_turn() -> int:
        batcher = LoopBatcher(
            asyncio.get_running_loop(), cast(Publisher, SimpleNamespace(send=handed.append))
        )
        for _ in range(3):
            batcher.add(cast(Send, object()))
        before = len(handed)
        await asyncio.sleep(0)
        return before

    assert asyncio.run(one_turn()) == 0
    assert [len(batch) for batch in handed] == [3]
