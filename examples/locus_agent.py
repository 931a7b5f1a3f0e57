"""A locus agent whose tools run on workers; locus's ScriptedModel plays the model, offline.

Needs a worker serving ``tasks`` and the same ``TOOLEXEC_*`` settings. Prints::

    search        [ { "source": "the-red-headed-league.txt", "title": "The Red...
    slow_report   Error: ToolTimeoutError: tool 'slow_report' timed out after 0.5s
    answer: Found it; the report took too long.
"""

from __future__ import annotations

import asyncio

from locus.agent.agent import Agent
from locus.testing import ScriptedModel, text, tool_call

from agent_client import remote_tool


async def main() -> None:
    model = ScriptedModel(
        [
            tool_call("search", call_id="call_1", query="red-headed league", limit=1),
            tool_call("slow_report", call_id="call_2", seconds=5),
            text("Found it; the report took too long."),
        ]
    )
    # With a real model: Agent(model="openai:gpt-4o", tools=[...]).
    tools = [remote_tool("search").as_locus(), remote_tool("slow_report", timeout=0.5).as_locus()]
    agent = Agent(model=model, tools=tools, context_window=32_000)
    result = await agent.arun("Find the red-headed league story, then run the slow report.")
    for message in result.state.messages:
        if message.role == "tool":
            shown = " ".join(str(message.content).split())
            print(f"{message.name:<13} {shown if len(shown) <= 70 else shown[:60] + '...'}")
    print("answer:", result.message)


if __name__ == "__main__":
    asyncio.run(main())
