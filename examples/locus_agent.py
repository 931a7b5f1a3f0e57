"""A locus agent whose tools run on workers; locus's ScriptedModel plays the model, offline.

The run shows locus's own ways: a timeout is the tool's error result, a tool's
progress streams live as ``ToolProgressEvent`` s, and a call that needs approval is
held at locus's admission gate, pausing the run until a person decides and it resumes.
Needs a worker serving ``tasks`` and ``examples.my_tools`` and the same ``TOOLEXEC_*``
settings. Prints::

    progress: reindex 3/3 indexed c.txt
    approve? book_flight {"flight_id": "BA117", "passenger": "Ada Lovelace"}
    search        [ { "source": "the-red-headed-league.txt", "title": "The Red...
    slow_report   Error: ToolTimeoutError: tool 'slow_report' timed out after 0.5s
    reindex       3
    book_flight   booked BA117 for Ada Lovelace
    answer: Found it, re-indexed and booked; the report took too long.
"""

from __future__ import annotations

import asyncio
import json

from locus.agent.agent import Agent
from locus.control import InMemoryApprovals
from locus.core.events import (
    InterruptEvent,
    LocusEvent,
    TerminateEvent,
    ToolCompleteEvent,
    ToolProgressEvent,
)
from locus.testing import ScriptedModel, text, tool_call

from agent_client import remote_tool


async def main() -> None:
    model = ScriptedModel(
        [
            tool_call("search", call_id="call_1", query="red-headed league", limit=1),
            tool_call("slow_report", call_id="call_2", seconds=5),
            tool_call("reindex", call_id="call_3", paths=["a.txt", "b.txt", "c.txt"]),
            tool_call("book_flight", call_id="call_4", flight_id="BA117", passenger="Ada Lovelace"),
            text("Found it, re-indexed and booked; the report took too long."),
        ]
    )
    approvals = InMemoryApprovals()  # where the decisions are recorded (FileApprovals: on disk)
    # With a real model: Agent(model="openai:gpt-4o", tools=[...]).
    tools = [
        remote_tool("search").as_locus(),
        remote_tool("slow_report", timeout=0.5).as_locus(),
        remote_tool("reindex").as_locus(),
        remote_tool("book_flight", requires_approval=True).as_locus(approvals=approvals),
    ]
    agent = Agent(model=model, tools=tools, context_window=32_000)
    events: list[LocusEvent] = [
        e async for e in agent.run("Find the story, run the report, re-index, book BA117.")
    ]
    progress = [e for e in events if isinstance(e, ToolProgressEvent)]
    if progress:
        last = progress[-1]
        print(f"progress: {last.tool_name} {last.progress:g}/{last.total:g} {last.message}")
    for pause in [e for e in events if isinstance(e, InterruptEvent)]:
        print("approve?", pause.metadata["action"], json.dumps(pause.metadata["arguments"]))
        approvals.decide(
            pause.metadata["approval_id"], "approved", by="ada"
        )  # a person decides here
        events += [e async for e in agent.resume("approved", perform_dangling=True)]
    for done in [e for e in events if isinstance(e, ToolCompleteEvent)]:
        # What the model read: the result, or locus's "Error: <type>: <message>".
        shown = " ".join(str(done.result if done.error is None else f"Error: {done.error}").split())
        if done.tool_name == "book_flight" and done.error is None:
            booking = json.loads(done.result or "{}")
            shown = f"booked {booking['flight_id']} for {booking['passenger']}"
        print(f"{done.tool_name:<13} {shown if len(shown) <= 70 else shown[:60] + '...'}")
    answer = next(e for e in reversed(events) if isinstance(e, TerminateEvent))
    print("answer:", answer.final_message)


if __name__ == "__main__":
    asyncio.run(main())
