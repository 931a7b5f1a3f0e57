"""``remote_tools()``: every tool live workers serve, as one :class:`RemoteToolset`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from agent_client.abandon import OnAbandon, on_abandon_overrides
from agent_client.approval import approval_overrides
from agent_client.client import ToolClient, get_client
from agent_client.deadline import NOT_SET, Timeout
from agent_client.remote import RemoteTool

__all__ = ["RemoteToolset", "remote_tools"]


class RemoteToolset:
    """Every tool in the catalog that a live worker serves, as one provider."""

    _is_lazy_tool_provider = True

    def __init__(self, tools: Iterable[RemoteTool]) -> None:
        self._tools = tuple(tools)

    def __iter__(self) -> Iterator[RemoteTool]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def __getitem__(self, name: str) -> RemoteTool:
        for remote in self._tools:
            if remote.name == name:
                return remote
        raise KeyError(name)

    @property
    def names(self) -> list[str]:
        """The tools' names."""
        return [t.name for t in self._tools]

    def as_tools(self) -> list[Any]:
        """Every tool as a LazyBridge ``Tool``."""
        return [tool for remote in self._tools for tool in remote.as_tools()]

    def as_locus(self, *, approvals: Any = None) -> list[Any]:
        """Every tool as a ``locus`` ``Tool`` (``approvals``: see :meth:`RemoteTool.as_locus`)."""
        return [remote.as_locus(approvals=approvals) for remote in self._tools]

    def as_openai_agents(self) -> list[Any]:
        """Every tool as an openai-agents ``FunctionTool``."""
        return [remote.as_openai_agents() for remote in self._tools]

    def as_langchain(self) -> list[Any]:
        """Every tool as a LangChain ``StructuredTool``."""
        return [remote.as_langchain() for remote in self._tools]

    def as_pydantic_ai(self) -> list[Any]:
        """Every tool as a ``pydantic_ai.Tool``."""
        return [remote.as_pydantic_ai() for remote in self._tools]


def remote_tools(
    *,
    default_timeout: Timeout = NOT_SET,
    queues: Iterable[str] | None = None,
    client: ToolClient | None = None,
    wait: float | None = None,
    requires_approval: bool | Mapping[str, bool] | None = None,
    on_abandon: OnAbandon | Mapping[str, OnAbandon] | None = None,
) -> RemoteToolset:
    """Proxies for every tool a live worker serves.

    Args:
        default_timeout: Deadline for every tool of the set, below a framework's own
            default (``Agent(tool_timeout=)``) and above each tool's own
            ``@tool(timeout=)``; None for no deadline.
        queues: Only tools on these queues.
        client: Dispatch through this client instead of the process's.
        wait: Seconds to wait for a live worker to serve at least one tool (on
            ``queues``), for an agent that starts before its workers; the set is empty
            if none does by then. By default, the tools served now.
        requires_approval: Overrides each tool's ``@tool(requires_approval=)``: True or
            False for every tool of the set, or a mapping of tool names to True or False
            for those tools (a name not in the set raises ``ValueError``); None keeps
            each tool's own.
        on_abandon: Overrides each tool's ``@tool(on_abandon=)``: ``"cancel"`` or
            ``"leave"`` for every tool of the set, or a mapping of tool names to either;
            None keeps each tool's own (a call may override it again).

    Raises:
        ValueError: A bad ``wait`` or ``on_abandon``, or ``requires_approval`` or
            ``on_abandon`` names a tool not in the set.
        TypeError: A ``requires_approval`` value that is not True, False or None.
    """
    if wait is not None and (
        isinstance(wait, bool) or not isinstance(wait, int | float) or not wait >= 0
    ):
        raise ValueError(f"wait must be a number of seconds >= 0 or None; got {wait!r}")
    client = client or get_client()
    wanted = None if queues is None else frozenset(queues)
    specs = client.catalog.specs(wanted, wait=wait)
    names = [s.name for s in specs]
    approvals, abandons = (
        approval_overrides(requires_approval, names),
        on_abandon_overrides(on_abandon, names),
    )
    return RemoteToolset(
        RemoteTool(
            s,
            default_timeout=default_timeout,
            client=client,
            requires_approval=approvals.get(s.name),
            on_abandon=abandons.get(s.name),
        )
        for s in specs
    )
