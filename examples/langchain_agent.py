"""A LangChain agent whose tools run on workers; the model is scripted, so it runs offline.

The agent is LangChain's ``create_agent`` (its loop is a LangGraph graph whose
``ToolNode`` runs the tools); the model is LangChain's own fake chat model, taught to
accept ``bind_tools``. Needs a worker serving ``tasks`` and the same ``TOOLEXEC_*``
settings. Prints::

    search       success  [{"source": "the-red-headed-league.txt", "tit...
    slow_report  error    tool 'slow_report' timed out after 0.5s
    answer: Found it; the report took too long.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage

from agent_client import remote_tool

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


def tool_agent(model: ScriptedChatModel, tools: Sequence[Any]) -> Any:
    """LangChain's agent: the model calls tools until it answers."""
    return create_agent(model, tools)


def main() -> None:
    model = scripted(
        [("search", {"query": "red-headed league", "limit": 1})],
        [("slow_report", {"seconds": 5})],
        "Found it; the report took too long.",
    )
    # With a real model: create_agent("anthropic:claude-sonnet-4-5", tools)
    search = remote_tool("search").as_langchain()
    slow_report = remote_tool("slow_report", timeout=0.5).as_langchain()
    agent = tool_agent(model, [search, slow_report])
    state = agent.invoke({"messages": [("user", "Find the story, then run the report.")]})
    for message in state["messages"]:
        if isinstance(message, ToolMessage):
            text = str(message.content)
            shown = text if len(text) <= 45 else text[:45] + "..."
            print(f"{message.name:<12} {message.status:<8} {shown}")
    print("answer:", state["messages"][-1].content)


if __name__ == "__main__":
    main()
