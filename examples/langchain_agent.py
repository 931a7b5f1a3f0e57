"""A LangChain agent whose tools run on workers; the model is scripted, so it runs offline.

The agent is LangChain's ``create_agent`` (its loop is a LangGraph graph whose
``ToolNode`` runs the tools); the model is LangChain's own fake chat model, taught to
accept ``bind_tools``. The run shows LangChain's own ways: a timeout is an error
``ToolMessage``, a tool's progress is written to the graph's custom stream, and a call
that needs approval pauses the graph at LangGraph's interrupt until it is resumed with
a decision. Needs a worker serving ``tasks`` and ``examples.my_tools`` and the same
``TOOLEXEC_*`` settings. Prints::

    progress: reindex 3/3 indexed c.txt
    approve? book_flight {"flight_id": "BA117", "passenger": "Ada Lovelace"}
    search       success  [{"source": "the-red-headed-league.txt", "tit...
    slow_report  error    tool 'slow_report' timed out after 0.5s
    reindex      success  3
    book_flight  success  booked BA117 for Ada Lovelace
    answer: Found it, re-indexed and booked; the report took too long.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from agent_client import remote_tool
from agent_client.frameworks.langchain import TOOL_PROGRESS

__all__ = ["ScriptedChatModel", "main", "scripted", "tool_agent"]

#: One model turn: the tool calls to make (name, arguments), or the final answer.
Turn = Sequence[tuple[str, dict[str, Any]]] | str


class ScriptedChatModel(GenericFakeChatModel):
    """LangChain's fake chat model, accepting ``bind_tools`` as agents require."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:  # type: ignore[override]
        """The script already names the tools; nothing to bind."""
        return self


def scripted(*turns: Turn) -> ScriptedChatModel:
    """A model that answers each turn with the next scripted message."""
    messages = [
        AIMessage(content=turn)
        if isinstance(turn, str)
        else AIMessage(
            content="",
            tool_calls=[
                {"name": name, "args": args, "id": f"call-{n}-{i}", "type": "tool_call"}
                for i, (name, args) in enumerate(turn)
            ],
        )
        for n, turn in enumerate(turns)
    ]
    return ScriptedChatModel(messages=iter(messages))


def tool_agent(model: ScriptedChatModel, tools: Sequence[Any], **options: Any) -> Any:
    """LangChain's agent: the model calls tools until it answers (``options``:
    ``create_agent``'s)."""
    return create_agent(model, tools, **options)


def main() -> None:
    model = scripted(
        [("search", {"query": "red-headed league", "limit": 1})],
        [("slow_report", {"seconds": 5})],
        [("reindex", {"paths": ["a.txt", "b.txt", "c.txt"]})],
        [("book_flight", {"flight_id": "BA117", "passenger": "Ada Lovelace"})],
        "Found it, re-indexed and booked; the report took too long.",
    )
    # With a real model: create_agent("anthropic:claude-sonnet-4-5", tools, checkpointer=...)
    tools = [
        remote_tool("search").as_langchain(),
        remote_tool("slow_report", timeout=0.5).as_langchain(),
        remote_tool("reindex").as_langchain(),
        remote_tool("book_flight", requires_approval=True).as_langchain(),
    ]
    agent = tool_agent(model, tools, checkpointer=InMemorySaver())  # an interrupt needs one
    config: RunnableConfig = {"configurable": {"thread_id": "librarian-1"}}
    given: Any = {
        "messages": [("user", "Find the story, run the report, re-index, book BA117 for Ada.")]
    }
    while True:
        last = None
        for chunk in agent.stream(given, config, stream_mode="custom"):
            if isinstance(chunk, dict) and chunk.get("type") == TOOL_PROGRESS:
                last = chunk
        if last is not None:
            print(f"progress: {last['tool']} {last['done']:g}/{last['total']:g} {last['message']}")
        pending = agent.get_state(config).interrupts
        if not pending:
            break
        for waiting in pending:
            print("approve?", waiting.value["name"], json.dumps(waiting.value["args"]))
        given = Command(
            resume={waiting.id: {"type": "approve"} for waiting in pending}
        )  # a person decides
    messages = agent.get_state(config).values["messages"]
    for message in messages:
        if isinstance(message, ToolMessage):
            text = str(message.content)
            if message.name == "book_flight" and message.status == "success":
                text = f"booked {message.artifact['flight_id']} for {message.artifact['passenger']}"
            shown = text if len(text) <= 45 else text[:45] + "..."
            print(f"{message.name:<12} {message.status:<8} {shown}")
    print("answer:", messages[-1].content)


if __name__ == "__main__":
    main()
