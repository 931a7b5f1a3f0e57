"""agent_client.sent_calls: the ids of the calls a block sends, in order, in its context only."""

from __future__ import annotations

import asyncio

from agent_client import sent_calls
from agent_client.calls import SentCall, record_sent


def test_a_block_records_the_calls_sent_in_it_and_tasks_it_started_in_order() -> None:
    async def main() -> list[SentCall]:
        with sent_calls() as sent:
            record_sent("c-1", "search")
            await asyncio.ensure_future(_send("c-2", "book"))  # a task started inside
        record_sent("c-3", "search")  # after the block: not recorded
        return sent

    assert asyncio.run(main()) == [SentCall("c-1", "search"), SentCall("c-2", "book")]


def test_nested_blocks_record_into_the_innermost_and_nothing_outside_one_is_kept() -> None:
    record_sent("nobody", "search")  # no block: dropped
    with sent_calls() as outer:
        record_sent("a", "t")
        with sent_calls() as inner:
            record_sent("b", "t")
        record_sent("c", "t")
    assert [s.call_id for s in outer] == ["a", "c"]
    assert [s.call_id for s in inner] == ["b"]


async def _send(call_id: str, tool: str) -> None:
    record_sent(call_id, tool)
