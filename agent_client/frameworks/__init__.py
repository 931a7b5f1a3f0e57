"""Framework adapters, one small module each, beside the core.

Each maps its framework's run id, default deadline and error convention onto
``RemoteTool.invoke``. Each is a public function (``langchain_tool(proxy)``, ...) and
is named in :data:`ADAPTERS`, by which the core loads it only when asked for it
(``RemoteTool.as_locus()``, ``as_tools()`` ...): the core imports no adapter, and each
adapter imports the core. An adapter imports its framework, an optional extra, and a
missing extra raises :class:`MissingExtra` naming it.

One rule for the run id, in every adapter, the first that applies:

1. a run id given for this run: an object the run carries for the user (openai-agents'
   ``context``, pydantic-ai's ``deps``) with a ``toolexec_run_id`` or ``run_id``
   attribute or mapping key (:func:`carried_run_id`), LangChain's
   ``configurable["toolexec_run_id"]`` or LangGraph's run id, MCP's ``_meta``;
2. an enclosing :func:`~agent_client.run_scope`, so one scope can span several
   framework runs;
3. the framework's own run (a LazyBridge ``agent(...)``, locus's
   ``ToolContext.run_id``, pydantic-ai's ``RunContext.run_id``, the openai-agents
   trace, a LangGraph invocation, an MCP session).

One rule for cancellation, in every adapter: a framework's cancel of a run or of one
tool call (the cancel of the task awaiting the tool, pydantic-ai's ``RunCancelled``,
MCP's ``notifications/cancelled``...) reaches ``RemoteTool.invoke`` as the
``asyncio.CancelledError`` it is, never caught or turned into a result: the caller
abandons the call, so a tool declared ``@tool(on_abandon="cancel")`` is stopped on its
worker, and one that leaves it (the default) runs on. A call cancelled by someone else
(``toolexec cancel``, ``CallHandle.cancel()``) is a failure the model should not retry,
worded by :func:`cancelled_text`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable as _Callable
from collections.abc import Mapping as _Mapping
from types import ModuleType as _ModuleType
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

if _TYPE_CHECKING:
    from agent_client.errors import ToolCancelled

__all__ = [
    "ADAPTERS",
    "MissingExtra",
    "RUN_ID_FIELDS",
    "adapter",
    "carried_run_id",
    "cancelled_text",
    "require",
]

#: Each framework's adapter: its module and the function that turns a proxy into the
#: framework's tool.
ADAPTERS: dict[str, tuple[str, str]] = {
    "lazybridge": ("agent_client.frameworks.lazybridge", "lazybridge_tool"),
    "locus": ("agent_client.frameworks.locus", "locus_tool"),
    "openai_agents": ("agent_client.frameworks.openai_agents", "openai_agents_tool"),
    "langchain": ("agent_client.frameworks.langchain", "langchain_tool"),
    "pydantic_ai": ("agent_client.frameworks.pydantic_ai", "pydantic_ai_tool"),
}

#: The names under which a run's context object may carry the toolexec run, first wins.
RUN_ID_FIELDS = ("toolexec_run_id", "run_id")


def adapter(framework: str) -> _Callable[..., _Any]:
    """The adapter of ``framework`` (a key of :data:`ADAPTERS`), its module loaded now.

    Raises:
        MissingExtra: The framework's extra is not installed.
    """
    module, function = ADAPTERS[framework]
    found: _Callable[..., _Any] = getattr(importlib.import_module(module), function)
    return found


class MissingExtra(ImportError):
    """A framework adapter was asked for, but its optional extra is not installed."""


def require(module: str, *, extra: str, framework: str) -> _ModuleType:
    """Import ``module`` or raise :class:`MissingExtra` saying which extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(
            f"{framework} support needs the toolexec[{extra}] extra: pip install "
            f"'toolexec[{extra}]' (could not import {module!r}: {exc})"
        ) from exc


def carried_run_id(carrier: object) -> str | None:
    """The run id ``carrier`` names for toolexec, or None.

    Read from its ``toolexec_run_id``, else its ``run_id``: a key of a mapping, an
    attribute of anything else. None, a missing name and an empty string name no run.
    """
    for name in RUN_ID_FIELDS:
        value = carrier.get(name) if isinstance(carrier, _Mapping) else getattr(carrier, name, None)
        if value is not None and value != "":
            return str(value)
    return None


def cancelled_text(error: ToolCancelled) -> str:
    """What a model is told of a call someone else cancelled: stopped on purpose, not to retry."""
    return f"{error}: it was stopped on purpose, so do not call it again unless you are asked to"
