"""LazyBridge integration: a :class:`RemoteTool` as a real ``lazybridge.Tool``.

``Agent(tools=[remote_tool("search")])`` works because ``RemoteTool`` is a LazyBridge
ToolProvider whose ``as_tools()`` lands here. The Tool's function is ``async``, so
LazyBridge awaits it on its loop and can cancel it; no thread is used per call.

Deadlines follow toolexec's precedence with ``Agent(tool_timeout=)`` as the framework
level: LazyBridge hands the effective limit to ``Tool._dispatch``, which this module's
subclass records for the call. A remote timeout raises LazyBridge's own
``ToolTimeoutError``, so the model is shown ``[TOOL_TIMEOUT] ...``; any other remote
failure is shown as ``Tool error: ...`` with the remote type in the text. Either way
the run goes on.

This module imports LazyBridge (the ``toolexec[lazybridge]`` extra); nothing imports
it until ``as_tools()`` is called.
"""

from __future__ import annotations

import json
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import lazybridge
from lazybridge import Tool

from agent_client.deadline import NOT_SET, Timeout
from agent_client.errors import ToolTimeoutError

if TYPE_CHECKING:
    from agent_client.remote import RemoteTool

__all__ = ["lazybridge_tool"]

#: The limit LazyBridge is enforcing on the current tool call (its ``_dispatch`` arg).
_framework_limit: ContextVar[Timeout] = ContextVar("toolexec_lazybridge_limit", default=NOT_SET)


class _RemoteTool(Tool):
    # LazyBridge 1.8 passes the effective limit (the tool's own, else Agent's
    # tool_timeout, else LLMEngine's) only to this private method; a test pins it.
    async def _dispatch(self, kwargs: dict[str, Any], timeout: float | None) -> Any:
        token = _framework_limit.set(NOT_SET if timeout is None else timeout)
        try:
            return await super()._dispatch(kwargs, timeout)
        finally:
            _framework_limit.reset(token)


def lazybridge_tool(remote: RemoteTool) -> Tool:
    """Build the ``lazybridge.Tool`` that runs ``remote`` on a worker."""

    async def call(**arguments: Any) -> str:
        try:
            result = await remote.invoke(arguments, framework_timeout=_framework_limit.get())
        except ToolTimeoutError as exc:
            # Worded as LazyBridge words its own, so the model reads the same text
            # whichever deadline fires first.
            message = f"Tool {remote.name!r} timed out after {exc.timeout}s"
            raise lazybridge.ToolTimeoutError(message, tool_name=remote.name, timeout=exc.timeout) from exc
        return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)

    tool: Tool = _RemoteTool.from_schema(
        remote.name,
        remote.description,
        remote.parameters,
        call,
        timeout=remote.lazybridge_limit(),
    )
    return tool
