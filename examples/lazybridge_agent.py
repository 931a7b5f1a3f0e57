"""A LazyBridge agent whose tools run on workers; the model is scripted, so it runs offline.

The run shows LazyBridge's own ways: a timeout is its ``[TOOL_TIMEOUT]`` result, a
tool's progress is a ``"tool_progress"`` event of the agent's ``Session``, and the
engine's approval gate is asked before a call, here before the one that needs a
person. Needs a worker serving ``tasks`` and ``examples.my_tools`` and the same
``TOOLEXEC_*`` settings. Prints::

    approve? book_flight {"flight_id": "BA117", "passenger": "Ada Lovelace"}
    progress: reindex 3/3 indexed c.txt
    search        [{"source": "the-red-headed-league.txt", "tit...
    slow_report   [TOOL_TIMEOUT] Tool 'slow_report' timed out a...
    reindex       3
    book_flight   booked BA117 for Ada Lovelace
    answer: Found it, re-indexed and booked; the report took too long.
"""

from __future__ import annotations

import json

from lazybridge import ApprovalDecision, ApprovalRequest, Session

from agent_client import remote_tool
from agent_client.frameworks.lazybridge import TOOL_PROGRESS
from agent_client.testing import ScriptedProvider, scripted_agent


def main() -> None:
    provider = ScriptedProvider(
        [
            [("search", {"query": "red-headed league", "limit": 1})],
            [("slow_report", {"seconds": 5})],
            [("reindex", {"paths": ["a.txt", "b.txt", "c.txt"]})],
            [("book_flight", {"flight_id": "BA117", "passenger": "Ada Lovelace"})],
            "Found it, re-indexed and booked; the report took too long.",
        ]
    )
    tools = [
        remote_tool("search"),
        remote_tool("slow_report"),
        remote_tool("reindex"),
        remote_tool("book_flight", requires_approval=True),
    ]
    needs_a_person = {tool.name for tool in tools if tool.requires_approval}

    def gate(request: ApprovalRequest) -> ApprovalDecision:
        """LazyBridge asks before every call; a person is asked about those that need one."""
        if request.name in needs_a_person:
            print("approve?", request.name, json.dumps(dict(request.arguments)))
        return ApprovalDecision.allow()  # a person decides here

    session = Session()
    # With a real model: Agent(engine=LLMEngine("claude-...", approval_gate=gate), tools=[...], ...)
    agent = scripted_agent(
        tools, provider, engine_options={"approval_gate": gate}, session=session, tool_timeout=0.5
    )
    envelope = agent("Find the story, run the slow report, re-index, book BA117 for Ada.")
    progress = session.events.query(event_type=TOOL_PROGRESS)
    if progress:
        last = progress[-1]["payload"]
        print(f"progress: {last['tool']} {last['done']:g}/{last['total']:g} {last['message']}")
    for result in provider.tool_results():
        shown = str(result.content)
        if result.tool_name == "book_flight":
            booking = json.loads(shown)
            shown = f"booked {booking['flight_id']} for {booking['passenger']}"
        print(f"{result.tool_name:<13} {shown if len(shown) <= 48 else shown[:45] + '...'}")
    print("answer:", envelope.text())


if __name__ == "__main__":
    main()
