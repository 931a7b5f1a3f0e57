"""``remote_tool()`` and ``remote_tools()``: proxies for tools that run on workers.

A :class:`RemoteTool` knows its tool only from the catalog (name, description, JSON
Schema), so the agent never imports the tool's code. It is callable from sync and
async code, exports OpenAI and Anthropic tool schemas, and is a LazyBridge
ToolProvider (``Agent(tools=[remote_tool("search")])``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from agent_client.client import ToolClient, get_client
from agent_client.deadline import NOT_SET, Timeout, check_timeout, resolve_timeout
from executor.protocol import ToolSpec

__all__ = ["RemoteTool", "RemoteToolset", "remote_tool", "remote_tools"]


class RemoteTool:
    """A proxy for one tool in the catalog.

    Attributes:
        name: The tool's name.
        description: What the tool does, as the model reads it.
        parameters: JSON Schema of the arguments.
        idempotent: True when repeats within one run share one execution.
    """

    #: LazyBridge's ToolProvider protocol: ``Agent`` calls :meth:`as_tools`.
    _is_lazy_tool_provider = True

    def __init__(
        self,
        spec: ToolSpec,
        *,
        timeout: Timeout = NOT_SET,
        default_timeout: Timeout = NOT_SET,
        client: ToolClient | None = None,
    ) -> None:
        self.spec = spec
        self._timeout = check_timeout(timeout)
        self._default_timeout = check_timeout(default_timeout, what="default_timeout")
        self._client = client

    name = property(lambda self: self.spec.name, doc="The tool's name.")
    description = property(lambda self: self.spec.description, doc="What the tool does.")
    parameters = property(lambda self: self.spec.parameters, doc="JSON Schema of the arguments.")
    idempotent = property(lambda self: self.spec.idempotent, doc="Repeats within a run share one execution.")

    @property
    def client(self) -> ToolClient:
        """The client this proxy dispatches through (the process's, unless given)."""
        return self._client or get_client()

    @property
    def timeout(self) -> float | None:
        """The deadline in seconds a call gets by default; None means no deadline."""
        return self.effective_timeout()

    def effective_timeout(self, call: Timeout = NOT_SET, framework: Timeout = NOT_SET) -> float | None:
        """Resolve the deadline: this call, this proxy, the framework, the tool, settings."""
        framework = self._default_timeout if framework is NOT_SET else check_timeout(framework, what="framework timeout")
        settings_default = self.client.settings.default_timeout
        return resolve_timeout(check_timeout(call), self._timeout, framework, _unset_if_none(self.spec.timeout), settings_default)

    def lazybridge_limit(self) -> float | None:
        """The limit LazyBridge should enforce itself: one set on this proxy, if any.

        Left None when none is, so ``Agent(tool_timeout=)`` applies as the framework
        level. LazyBridge has no per-tool "no limit", so a proxy set to None (no
        deadline) gets :data:`_NO_LIMIT`, which outranks the agent's default.
        """
        for level in (self._timeout, self._default_timeout):
            if level is not NOT_SET:
                return _NO_LIMIT if level is None else float(level)
        return None

    # -- calling -------------------------------------------------------------------

    async def invoke(
        self,
        arguments: dict[str, Any],
        *,
        timeout: Timeout = NOT_SET,
        run_id: str | None = None,
        idempotency_key: str | None = None,
        framework_timeout: Timeout = NOT_SET,
    ) -> Any:
        """Run the tool with ``arguments`` (a dict); per-call options are keywords.

        Options never clash with argument names, since the arguments are one dict.

        Args:
            arguments: The tool's arguments.
            timeout: This call's deadline in seconds (None: no deadline); wins over
                every default.
            run_id: The agent run; default: the enclosing ``run_scope()``, if any.
            idempotency_key: Use this key instead of the one derived from the run,
                tool and arguments (idempotent tools only).
            framework_timeout: The framework's default deadline (adapters set it).

        Raises:
            RemoteToolError: One of its subclasses; see ``agent_client.errors``.
        """
        limit = self.effective_timeout(timeout, framework_timeout)
        options = self._options(run_id, idempotency_key)
        return await self.client.call(self.spec, arguments, timeout=limit, **options)

    def invoke_sync(
        self,
        arguments: dict[str, Any],
        *,
        timeout: Timeout = NOT_SET,
        run_id: str | None = None,
        idempotency_key: str | None = None,
        framework_timeout: Timeout = NOT_SET,
    ) -> Any:
        """Blocking form of :meth:`invoke`; works inside and outside an event loop."""
        limit = self.effective_timeout(timeout, framework_timeout)
        options = self._options(run_id, idempotency_key)
        return self.client.call_sync(self.spec, arguments, timeout=limit, **options)

    def _options(self, run_id: str | None, idempotency_key: str | None) -> dict[str, Any]:
        if idempotency_key is not None and not self.spec.idempotent:
            raise ValueError(f"tool {self.name!r} is not idempotent; it takes no idempotency_key")
        return {"run_id": run_id, "idempotency_key": idempotency_key}

    async def run(self, **arguments: Any) -> Any:
        """Run the tool: ``await search.run(query="...")``."""
        return await self.invoke(arguments)

    def run_sync(self, **arguments: Any) -> Any:
        """Run the tool and block until its result: ``search.run_sync(query="...")``."""
        return self.invoke_sync(arguments)

    def __call__(self, **arguments: Any) -> Any:
        """Same as :meth:`run_sync`."""
        return self.invoke_sync(arguments)

    # -- schemas for model APIs -----------------------------------------------------

    def to_openai_schema(self) -> dict[str, Any]:
        """The tool in OpenAI's function-calling format."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def to_anthropic_schema(self) -> dict[str, Any]:
        """The tool in Anthropic's tool-use format."""
        return {"name": self.name, "description": self.description, "input_schema": self.parameters}

    def as_tools(self) -> list[Any]:
        """This tool as LazyBridge ``Tool`` objects (needs ``toolexec[lazybridge]``)."""
        from agent_client.lazybridge import lazybridge_tool

        return [lazybridge_tool(self)]

    def __repr__(self) -> str:
        return f"RemoteTool({self.name!r}, queue={self.spec.queue!r}, timeout={self.timeout!r})"


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


def remote_tool(name: str, *, timeout: Timeout = NOT_SET, client: ToolClient | None = None) -> RemoteTool:
    """A proxy for the tool ``name``, read from the catalog.

    Args:
        name: The tool's registered name.
        timeout: Deadline in seconds for every call; None for no deadline. Wins over
            every other default.
        client: Dispatch through this client instead of the process's.

    Raises:
        ToolNotFound: No live worker serves ``name``; the message lists what exists.
        BrokerUnavailable: Redis cannot be reached.
    """
    client = client or get_client()
    return RemoteTool(client.catalog.spec(name), timeout=timeout, client=client)


def remote_tools(
    *, default_timeout: Timeout = NOT_SET, queues: Iterable[str] | None = None, client: ToolClient | None = None
) -> RemoteToolset:
    """Proxies for every tool a live worker serves.

    Args:
        default_timeout: Deadline for tools that set none through ``remote_tool``; it
            wins over each tool's own timeout.
        queues: Only tools on these queues.
        client: Dispatch through this client instead of the process's.
    """
    client = client or get_client()
    wanted = None if queues is None else frozenset(queues)
    specs = client.catalog.specs(wanted)
    return RemoteToolset(RemoteTool(s, default_timeout=default_timeout, client=client) for s in specs)


#: What "no deadline" is told to LazyBridge: a year.
_NO_LIMIT = 365 * 24 * 3600.0


def _unset_if_none(value: float | None) -> Timeout:
    return NOT_SET if value is None else value

