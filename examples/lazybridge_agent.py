"""A LazyBridge agent whose tools run on workers; the model is scripted, so it runs offline.

Needs a worker serving ``tasks`` and the same ``TOOLEXEC_*`` settings. Prints::

    search        [{"source": "the-red-headed-league.txt", "tit...
    slow_report   [TOOL_TIMEOUT] Tool 'slow_report' timed out a...
    answer: Found it; the report took too long.
"""

from __future__ import annotations

from agent_client import remote_tool
from agent_client.testing import ScriptedProvider, scripted_agent


def main() -> None:
    provider = ScriptedProvider(
        [
            [("search", {"query": "red-headed league", "limit": 1})],
            [("slow_report", {"seconds": 5})],
            "Found it; the report took too long.",
        ]
    )
    # With a real model: Agent(engine=LLMEngine("claude-..."), tools=[...], tool_timeout=0.5)
    agent = scripted_agent([remote_tool("search"), remote_tool("slow_report")], provider, tool_timeout=0.5)
    envelope = agent("Find the red-headed league story, then run the slow report.")
    for result in provider.tool_results():
        print(f"{result.tool_name:<13} {str(result.content)[:45]}...")
    print("answer:", envelope.text())


if __name__ == "__main__":
    main()
