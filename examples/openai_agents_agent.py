"""An openai-agents Agent whose tools run on workers; the model is scripted, so it runs offline.

The run shows the SDK's own ways: a timeout is text for the model, a tool's progress
is a span of the run's trace (the SDK's one channel for it), and a call that needs
approval stops the run with an interruption until it is approved. Needs a worker
serving ``tasks`` and ``examples.my_tools`` and the same ``TOOLEXEC_*`` settings; no
OpenAI API key. The model is the SDK's own ``agents.testing.ScriptedModel``. Prints::

    progress: reindex 3/3 indexed c.txt
    approve? book_flight {"flight_id":"BA117","passenger":"Ada Lovelace"}
    search        [{"source": "the-red-headed-league.txt", "tit...
    slow_report   [TOOL_TIMEOUT] Tool 'slow_report' timed out a...
    reindex       3
    book_flight   booked BA117 for Ada Lovelace
    answer: Found it, re-indexed and booked; the report took too long.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agents import (
    Agent,
    Runner,
    RunResult,
    ToolCallItem,
    ToolCallOutputItem,
    TracingProcessor,
    set_trace_processors,
)
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tracing import CustomSpanData, Span, Trace

from agent_client import remote_tool
from agent_client.frameworks.openai_agents import TOOL_PROGRESS


class PrintProgress(TracingProcessor):
    """A trace processor that prints the last progress span of each call, and exports nothing."""

    def on_span_end(self, span: Span[Any]) -> None:
        data = span.span_data
        if isinstance(data, CustomSpanData) and data.name == TOOL_PROGRESS:
            self.last = data.data
        elif span.span_data.type == "function" and getattr(self, "last", None):
            last, self.last = self.last, None
            print(f"progress: {last['tool']} {last['done']:g}/{last['total']:g} {last['message']}")

    def on_trace_start(self, trace: Trace) -> None: ...
    def on_trace_end(self, trace: Trace) -> None: ...
    def on_span_start(self, span: Span[Any]) -> None: ...
    def shutdown(self) -> None: ...
    def force_flush(self) -> None: ...


def shown(result: RunResult) -> list[tuple[str, str]]:
    """Each call's tool name and the output the model read, in order."""
    calls = [item.raw_item for item in result.new_items if isinstance(item, ToolCallItem)]
    names = {getattr(call, "call_id", None): getattr(call, "name", "?") for call in calls}
    outputs = [item for item in result.new_items if isinstance(item, ToolCallOutputItem)]
    return [
        (names.get(dict(item.raw_item).get("call_id"), "?"), str(item.output)) for item in outputs
    ]


async def main() -> None:
    # Traces stay in this process: the processor replaces the SDK's exporter.
    set_trace_processors([PrintProgress()])
    model = ScriptedModel(
        [
            [function_call("search", {"query": "red-headed league", "limit": 1}, call_id="c1")],
            [function_call("slow_report", {"seconds": 5}, call_id="c2")],
            [function_call("reindex", {"paths": ["a.txt", "b.txt", "c.txt"]}, call_id="c3")],
            [
                function_call(
                    "book_flight", {"flight_id": "BA117", "passenger": "Ada Lovelace"}, call_id="c4"
                )
            ],
            [assistant_message("Found it, re-indexed and booked; the report took too long.")],
        ]
    )
    # With a real model: Agent(name=..., model="gpt-5-mini", tools=[...])
    agent = Agent(
        name="librarian",
        model=model,
        tools=[
            remote_tool("search").as_openai_agents(),
            remote_tool("slow_report", timeout=0.5).as_openai_agents(),
            remote_tool("reindex").as_openai_agents(),
            remote_tool("book_flight", requires_approval=True).as_openai_agents(),
        ],
    )
    result = await Runner.run(
        agent, "Find the story, run the report, re-index, book BA117 for Ada."
    )
    while result.interruptions:
        state = result.to_state()
        for item in result.interruptions:
            print("approve?", item.raw_item.name, item.raw_item.arguments)  # type: ignore[union-attr]
            state.approve(item)  # a person decides here
        result = await Runner.run(agent, state)
    for name, output in shown(result):
        if name == "book_flight":
            booking = json.loads(output)
            output = f"booked {booking['flight_id']} for {booking['passenger']}"
        print(f"{name:<13} {output if len(output) <= 48 else output[:45] + '...'}")
    print("answer:", result.final_output)


if __name__ == "__main__":
    asyncio.run(main())
