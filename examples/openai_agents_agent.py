"""An openai-agents Agent whose tools run on workers; the model is scripted, so it runs offline.

Needs a worker serving ``tasks`` and the same ``TOOLEXEC_*`` settings; no OpenAI API key.
The model is the SDK's own ``agents.testing.ScriptedModel``. Prints::

    search        [{"source": "the-red-headed-league.txt", "tit...
    slow_report   [TOOL_TIMEOUT] Tool 'slow_report' timed out a...
    answer: Found it; the report took too long.
"""

from __future__ import annotations

import asyncio

from agents import Agent, Runner, ToolCallItem, ToolCallOutputItem, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call

from agent_client import remote_tool


def main() -> None:
    # Traces stay on this machine; toolexec then tells runs apart by the SDK's run context.
    set_tracing_disabled(True)
    model = ScriptedModel(
        [
            [function_call("search", {"query": "red-headed league", "limit": 1}, call_id="c1")],
            [function_call("slow_report", {"seconds": 5}, call_id="c2")],
            [assistant_message("Found it; the report took too long.")],
        ]
    )
    # With a real model: Agent(name=..., model="gpt-5-mini", tools=[...])
    agent = Agent(
        name="librarian",
        model=model,
        tools=[
            remote_tool("search").as_openai_agents(),
            remote_tool("slow_report", timeout=0.5).as_openai_agents(),
        ],
    )
    result = asyncio.run(
        Runner.run(agent, "Find the red-headed league story, then run the slow report.")
    )
    calls = [item.raw_item for item in result.new_items if isinstance(item, ToolCallItem)]
    outputs = [item.output for item in result.new_items if isinstance(item, ToolCallOutputItem)]
    for call, output in zip(calls, outputs, strict=True):
        print(f"{getattr(call, 'name', '?'):<13} {str(output)[:45]}...")
    print("answer:", result.final_output)


if __name__ == "__main__":
    main()
