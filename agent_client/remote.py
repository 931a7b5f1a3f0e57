"""``remote_tool()`` and ``remote_tools()``: proxies for tools that run on workers.

A :class:`RemoteTool` knows its tool only from the catalog (name, description, JSON
Schema), so the agent never imports the tool's code. It is callable from sync and
async code, exports OpenAI and Anthropic tool schemas, and is a LazyBridge
ToolProvider (``Agent(tools=[remote_tool("search")])``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Unpack

from agent_client.abandon import OnAbandon, check_on_abandon
from agent_client.approval import check_approval
from agent_client.client import ToolClient, get_client
from agent_client.deadline import NOT_SET, Timeout, check_timeout, resolve_timeout, time_left
from agent_client.errors import ToolTimeoutError
from agent_client.frameworks import adapter
from agent_client.handles import CallHandle, submit, submit_async
from agent_client.options import CallKeywords, CallOptions
from agent_client.progress import (
    ProgressEvent,
    ProgressSink,
    ToolResult,
    stream_call,
)
from agent_client.validation import parse_arguments
from wire.models import ToolSpec

__all__ = ["RemoteTool", "remote_tool"]

#: The keywords every way to call a tool takes (read once, not on every call).
_KEYWORDS = frozenset(CallKeywords.__annotations__)


class RemoteTool:
    """A proxy for one tool in the catalog.

    Attributes:
        name: The tool's name.
        description: What the tool does, as the model reads it.
        parameters: JSON Schema of the arguments.
        idempotent: True when repeats within one run share one execution.
        requires_approval: True when a person approves each call before it is sent
            (the tool's ``@tool(requires_approval=)``, unless this proxy overrides it).
        on_abandon: What happens to a call its caller stops waiting for: ``"cancel"``
            or ``"leave"`` (the tool's ``@tool(on_abandon=)``, unless this proxy or the
            call overrides it; :mod:`agent_client.abandon`).
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
        requires_approval: bool | None = None,
        on_abandon: OnAbandon | None = None,
    ) -> None:
        self.spec = spec
        self._on_abandon = check_on_abandon(on_abandon, spec.name)
        self._timeout = check_timeout(timeout)
        self._default_timeout = check_timeout(default_timeout, what="default_timeout")
        self._client = client
        self._approval = check_approval(requires_approval, spec.name)

    name = property(lambda self: self.spec.name, doc="The tool's name.")
    description = property(lambda self: self.spec.description, doc="What the tool does.")
    parameters = property(lambda self: self.spec.parameters, doc="JSON Schema of the arguments.")
    idempotent = property(
        lambda self: self.spec.idempotent, doc="Repeats within a run share one execution."
    )

    @property
    def on_abandon(self) -> OnAbandon:
        """Whether a call nobody waits for any more is cancelled or left to run: this
        proxy's override, else the tool's own."""
        return self.spec.on_abandon if self._on_abandon is None else self._on_abandon

    @property
    def requires_approval(self) -> bool:
        """Whether a person approves each call first: this proxy's override, else the tool's."""
        return self.spec.requires_approval if self._approval is None else self._approval

    @property
    def client(self) -> ToolClient:
        """The client this proxy dispatches through (the process's, unless given)."""
        return self._client or get_client()

    @property
    def timeout(self) -> float | None:
        """The deadline in seconds a call gets by default; None means no deadline."""
        return self.effective_timeout()

    @property
    def proxy_timeout(self) -> Timeout:
        """The timeout given to this proxy (``remote_tool(timeout=)``), or NOT_SET."""
        return self._timeout

    @property
    def default_timeout(self) -> Timeout:
        """The default given to this proxy (``remote_tools(default_timeout=)``), or NOT_SET."""
        return self._default_timeout

    def effective_timeout(
        self, call: Timeout = NOT_SET, framework: Timeout = NOT_SET
    ) -> float | None:
        """Resolve the deadline; the first level set wins.

        The levels, highest first: this call; this proxy (``remote_tool(timeout=)``);
        the framework's default (``framework``, which adapters pass); the toolset's
        default (``remote_tools(default_timeout=)``); the tool's own
        ``@tool(timeout=)``; the settings default.
        """
        return resolve_timeout(
            check_timeout(call),
            self._timeout,
            check_timeout(framework, what="framework timeout"),
            self._default_timeout,
            _unset_if_none(self.spec.timeout),
            self.client.settings.default_timeout,
        )

    # -- calling -------------------------------------------------------------------

    async def invoke(self, arguments: dict[str, Any] | str, **options: Unpack[CallKeywords]) -> Any:
        """Run the tool with ``arguments``; per-call options are keywords
        (:class:`~agent_client.options.CallKeywords`: ``timeout``, ``run_id``,
        ``idempotency_key``, ``framework_timeout``, ``on_progress``, ``started``,
        ``on_abandon``).

        Options never clash with argument names, since the arguments are one dict.

        Args:
            arguments: The tool's arguments: a dict, or the JSON text of one as a model's
                tool call carries it (read strictly by
                :func:`~agent_client.validation.parse_arguments`; blank means none).
            **options: The call's options. ``on_progress`` is called on this event loop
                with each :class:`~agent_client.progress.ProgressEvent` the tool
                reports, in order, before this returns; an awaitable it returns is
                awaited.

        Raises:
            RemoteToolError: One of its subclasses; see ``agent_client.errors``.
        """
        arguments, resolved = self._request(arguments, options)
        on_progress = options.get("on_progress")
        if on_progress is None:
            return await self.client.call(self.spec, arguments, resolved)
        sink = ProgressSink.for_loop(on_progress)
        try:
            return await self.client.call(self.spec, arguments, resolved, progress=sink)
        finally:
            await sink.aclose()

    def invoke_sync(self, arguments: dict[str, Any] | str, **options: Unpack[CallKeywords]) -> Any:
        """Blocking form of :meth:`invoke`; works inside and outside an event loop.

        ``on_progress`` is called on this process's progress thread, one event after
        the other, and every event is handled before this returns.
        """
        arguments, resolved = self._request(arguments, options)
        on_progress = options.get("on_progress")
        if on_progress is None:
            return self.client.call_sync(self.spec, arguments, resolved)
        sink = ProgressSink.for_thread(on_progress)
        try:
            return self.client.call_sync(self.spec, arguments, resolved, progress=sink)
        finally:
            sink.close()

    def submit(
        self, arguments: dict[str, Any] | str, **options: Unpack[CallKeywords]
    ) -> CallHandle:
        """Send the call and return its :class:`~agent_client.handles.CallHandle` once the
        call is durably queued: its record and its message confirmed by Redis (or
        RabbitMQ). The process may exit right after; the call still runs, and any process
        finds it with ``agent_client.attach(handle.id)`` for ``TOOLEXEC_HANDLE_TTL`` seconds.

        The options are :meth:`invoke`'s. The handle waits (``await handle.result()``,
        ``handle.result_sync()``), tells where the call is (``status()``) and cancels it
        (``cancel()``). ``on_progress`` is called on this process's progress thread. It
        blocks for one round trip to Redis (until the deadline while Redis is away): from
        async code use :meth:`submit_async`.

        Raises:
            ToolArgumentsInvalid: The arguments do not fit; nothing is sent.
            BrokerUnavailable: The call was not confirmed by its deadline (or within
                ``SUBMIT_PATIENCE``, 30 s, without one) and provably was not sent.
            ToolOutcomeUnknown: A write of it may have reached Redis, unconfirmed.
        """
        arguments, resolved = self._request(arguments, options)
        return submit(
            self.client, self.spec, arguments, resolved, on_progress=options.get("on_progress")
        )

    async def submit_async(
        self, arguments: dict[str, Any] | str, **options: Unpack[CallKeywords]
    ) -> CallHandle:
        """:meth:`submit` that awaits the confirmation without blocking the event loop."""
        arguments, resolved = self._request(arguments, options)
        return await submit_async(
            self.client, self.spec, arguments, resolved, on_progress=options.get("on_progress")
        )

    def _request(
        self, arguments: dict[str, Any] | str, options: CallKeywords
    ) -> tuple[dict[str, Any], CallOptions]:
        """The one body of :meth:`invoke`, :meth:`invoke_sync` and the submits: the
        arguments as a dict (a model's JSON text parsed, ToolArgumentsInvalid if bad) and
        the call's options resolved (the deadline from its levels, a run, a key, whether
        to cancel the call once abandoned)."""
        unknown = options.keys() - _KEYWORDS
        if unknown:
            raise TypeError(
                f"{self.name!r} takes the call options {sorted(_KEYWORDS)}; "
                f"got {sorted(unknown)} (a tool's arguments go in the arguments dict)"
            )
        on_abandon = check_on_abandon(options.get("on_abandon"), self.name) or self._on_abandon
        arguments = (
            parse_arguments(self.name, arguments) if isinstance(arguments, str) else arguments
        )
        idempotency_key = options.get("idempotency_key")
        if idempotency_key is not None and not self.spec.idempotent:
            raise ValueError(f"tool {self.name!r} is not idempotent; it takes no idempotency_key")
        limit = self.effective_timeout(
            options.get("timeout", NOT_SET), options.get("framework_timeout", NOT_SET)
        )
        started = options.get("started")
        left = time_left(limit, started)
        if limit is not None and left is not None and left <= 0:
            raise ToolTimeoutError(self.name, limit)  # it passed before the call could be sent
        resolved = CallOptions(
            timeout=limit,
            started=started,
            run_id=options.get("run_id"),
            idempotency_key=idempotency_key,
            on_abandon=on_abandon,
        )
        return arguments, resolved

    async def run(self, **arguments: Any) -> Any:
        """Run the tool: ``await search.run(query="...")``."""
        return await self.invoke(arguments)

    def run_sync(self, **arguments: Any) -> Any:
        """Run the tool and block until its result: ``search.run_sync(query="...")``."""
        return self.invoke_sync(arguments)

    def stream(self, **arguments: Any) -> AsyncIterator[ProgressEvent | ToolResult]:
        """Run the tool; yield its progress, then its result:
        ``async for event in tool.stream(...)``.

        Yields each :class:`~agent_client.progress.ProgressEvent` the tool reports, then
        one :class:`~agent_client.progress.ToolResult`. A failed call raises its
        :class:`RemoteToolError` after the progress it reported. Leaving the loop early
        stops waiting for the call.
        """
        return stream_call(self.invoke, arguments)

    def __call__(self, **arguments: Any) -> Any:
        """Same as :meth:`run_sync`."""
        return self.invoke_sync(arguments)

    # -- schemas for model APIs -----------------------------------------------------

    def to_openai_schema(self) -> dict[str, Any]:
        """The tool in OpenAI's function-calling format."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def to_anthropic_schema(self) -> dict[str, Any]:
        """The tool in Anthropic's tool-use format."""
        return {"name": self.name, "description": self.description, "input_schema": self.parameters}

    def as_tools(self) -> list[Any]:
        """This tool as LazyBridge ``Tool`` objects (needs ``toolexec[lazybridge]``).

        LazyBridge's ToolProvider protocol calls this; the adapter lives beside the
        core in :mod:`agent_client.frameworks.lazybridge`, loaded only now.
        """
        return [adapter("lazybridge")(self)]

    # -- other frameworks (each needs its extra; see agent_client.frameworks) ----------
    # The core names each adapter, and loads it only when asked (agent_client.frameworks.adapter):
    # it imports none of them, while each adapter imports the core.

    def as_locus(self, *, approvals: Any = None) -> Any:
        """This tool as a ``locus`` ``Tool`` (needs ``toolexec[locus]``); ``approvals``: the
        locus ``ApprovalStore`` a tool that requires approval records decisions in."""
        return adapter("locus")(self, approvals=approvals)

    def as_openai_agents(self) -> Any:
        """This tool as an openai-agents ``FunctionTool`` (needs ``toolexec[openai-agents]``)."""
        return adapter("openai_agents")(self)

    def as_langchain(self) -> Any:
        """This tool as a LangChain ``StructuredTool`` (needs ``toolexec[langchain]``)."""
        return adapter("langchain")(self)

    def as_pydantic_ai(self) -> Any:
        """This tool as a ``pydantic_ai.Tool`` (needs ``toolexec[pydantic-ai]``)."""
        return adapter("pydantic_ai")(self)

    def __repr__(self) -> str:
        return f"RemoteTool({self.name!r}, queue={self.spec.queue!r}, timeout={self.timeout!r})"


def remote_tool(
    name: str,
    *,
    timeout: Timeout = NOT_SET,
    client: ToolClient | None = None,
    wait: float | None = None,
    requires_approval: bool | None = None,
    on_abandon: OnAbandon | None = None,
) -> RemoteTool:
    """A proxy for the tool ``name``, read from the catalog.

    Calls through the proxy go on working while no worker serves the tool for a while
    (a rolling restart): each waits in the tool's queue for a worker, within its deadline.

    Args:
        name: The tool's registered name.
        timeout: Deadline in seconds for every call; None for no deadline. Wins over
            every other default.
        client: Dispatch through this client instead of the process's.
        wait: Seconds to wait for a live worker to serve ``name`` (an agent that starts
            before its workers); by default one must serve it now.
        requires_approval: True or False overrides the tool's ``@tool(requires_approval=)``
            for this proxy; None keeps it.
        on_abandon: ``"cancel"`` or ``"leave"`` overrides the tool's ``@tool(on_abandon=)``
            for this proxy's calls; None keeps it (a call may override it again).

    Raises:
        ToolNotFound: No live worker serves ``name`` (within ``wait``); the message
            lists what exists.
        BrokerUnavailable: Redis cannot be reached.
    """
    if wait is not None and (
        isinstance(wait, bool) or not isinstance(wait, int | float) or not wait >= 0
    ):
        raise ValueError(f"wait must be a number of seconds >= 0 or None; got {wait!r}")
    approval = check_approval(requires_approval, name)
    abandon = check_on_abandon(on_abandon, name)
    client = client or get_client()
    spec = client.catalog.spec(name, wait=wait)
    return RemoteTool(
        spec, timeout=timeout, client=client, requires_approval=approval, on_abandon=abandon
    )


def _unset_if_none(value: float | None) -> Timeout:
    return NOT_SET if value is None else value
