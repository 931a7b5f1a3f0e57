"""A pydantic-ai agent whose tools run on workers; the model is scripted, so it runs offline.

Needs a worker serving ``tasks`` and the same ``TOOLEXEC_*`` settings. Prints::

    search        success  [{"source":"the-red-headed-league.txt","title...
    slow_report   retried  tool 'slow_report' timed out after 0.5s; the ...
    answer: Found it; the report took too long.
"""

from __future__ import annotations

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agent_client import remote_tool

#: What the scripted model does on each turn: tool calls, then its answer.
SCRIPT: list[tuple[str, dict[str, object]] | str] = [
    ("search", {"query": "red-headed league", "limit": 1}),
    ("slow_report", {"seconds": 5}),
    "Found it; the report took too long.",
]


async def scripted_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Answer turn ``n`` with ``SCRIPT[n]``; a real model would decide here."""
    step = SCRIPT[sum(isinstance(m, ModelResponse) for m in messages)]
    if isinstance(step, str):
        return ModelResponse(parts=[TextPart(step)])
    return ModelResponse(parts=[ToolCallPart(*step)])


def main() -> None:
    # With a real model: Agent("anthropic:claude-...", tools=[...], tool_timeout=0.5)
    agent = Agent(
        FunctionModel(scripted_model),
        tools=[remote_tool("search").as_pydantic_ai(), remote_tool("slow_report").as_pydantic_ai()],
        tool_timeout=0.5,
    )
    result = agent.run_sync("Find the red-headed league story, then run the slow report.")
    for message in result.all_messages():
        for part in message.parts:
            if isinstance(part, ToolReturnPart):
                shown = part.model_response_str(wrap_if_error=False)
                print(f"{part.tool_name:<13} {part.outcome:<8} {shown[:45]}...")
    print("answer:", result.output)


if __name__ == "__main__":
    main()
