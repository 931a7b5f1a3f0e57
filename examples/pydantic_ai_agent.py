"""A pydantic-ai agent whose tools run on workers; the model is scripted, so it runs offline.

The run shows each of pydantic-ai's own ways: a timeout is a failed tool result (it
costs no retry), a tool's progress reaches the run's event stream, and a call that
needs a person's approval ends the run with ``DeferredToolRequests`` until it is
approved. Needs a worker serving ``tasks`` and ``examples.my_tools`` and the same
``TOOLEXEC_*`` settings. Prints::

    progress: reindex 3/3 indexed c.txt
    approve? book_flight {"flight_id":"BA117","passenger":"Ada Lovelace"}
    search        success  [{"source":"the-red-headed-league.txt","title...
    slow_report   failed   tool 'slow_report' timed out after 0.5s; the ...
    reindex       success  3
    book_flight   success  booked BA117 for Ada Lovelace
    answer: Found it, re-indexed and booked; the report took too long.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from agent_client import remote_tool
from agent_client.frameworks.pydantic_ai import RemoteToolProgress

#: What the scripted model does on each turn: tool calls, then its answer.
SCRIPT: list[tuple[str, dict[str, object]] | str] = [
    ("search", {"query": "red-headed league", "limit": 1}),
    ("slow_report", {"seconds": 5}),
    ("reindex", {"paths": ["a.txt", "b.txt", "c.txt"]}),
    ("book_flight", {"flight_id": "BA117", "passenger": "Ada Lovelace"}),
    "Found it, re-indexed and booked; the report took too long.",
]


async def scripted_model(
    messages: list[ModelMessage], info: AgentInfo
) -> AsyncIterator[str | DeltaToolCalls]:
    """Stream turn ``n``'s ``SCRIPT[n]``; a real model would decide here."""
    turn = sum(isinstance(m, ModelResponse) for m in messages)
    step = SCRIPT[turn]
    if isinstance(step, str):
        yield step
        return
    name, arguments = step
    yield {0: DeltaToolCall(name, json.dumps(arguments), tool_call_id=f"call-{turn}")}


async def show_progress(ctx: RunContext[None], events: AsyncIterator[Any]) -> None:
    """The run's event stream: print the last progress report of each step."""
    last = None
    async for event in events:
        if isinstance(event, RemoteToolProgress):
            last = event
    if last is not None and last.total is not None:
        print(f"progress: {last.tool_name} {last.done:g}/{last.total:g} {last.message}")


def main() -> None:
    # With a real model: Agent("anthropic:claude-...", tools=[...], tool_timeout=0.5, ...)
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(stream_function=scripted_model),
        tools=[
            remote_tool("search").as_pydantic_ai(),
            remote_tool("slow_report").as_pydantic_ai(),
            remote_tool("reindex").as_pydantic_ai(),
            remote_tool("book_flight", requires_approval=True).as_pydantic_ai(),
        ],
        tool_timeout=0.5,
        output_type=[str, DeferredToolRequests],
    )
    question = (
        "Find the red-headed league story, run the slow report, re-index, book BA117 for Ada."
    )
    result = agent.run_sync(question, event_stream_handler=show_progress)
    while isinstance(result.output, DeferredToolRequests):
        approvals: dict[str, bool] = {}
        for call in result.output.approvals:
            print("approve?", call.tool_name, call.args_as_json_str())
            approvals[call.tool_call_id] = True  # a person decides here
        result = agent.run_sync(
            message_history=result.all_messages(),
            deferred_tool_results=DeferredToolResults(approvals=approvals),
            event_stream_handler=show_progress,
        )
    for message in result.all_messages():
        for part in message.parts:
            if isinstance(part, ToolReturnPart):
                shown = part.model_response_str(wrap_if_error=False)
                if part.tool_name == "book_flight" and part.outcome == "success":
                    shown = f"booked {part.content['flight_id']} for {part.content['passenger']}"
                print(
                    f"{part.tool_name:<13} {part.outcome:<8} "
                    f"{shown if len(shown) <= 48 else shown[:45] + '...'}"
                )
    print("answer:", result.output)


if __name__ == "__main__":
    main()
