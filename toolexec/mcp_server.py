"""``toolexec mcp``: the live tool catalog as a Model Context Protocol server.

``toolexec mcp`` serves over stdio (an MCP client launches it as a subprocess);
``toolexec mcp --http PORT`` serves streamable HTTP at ``http://127.0.0.1:PORT/mcp``
(``--host`` to bind elsewhere). It is mcp's low-level ``Server`` with two handlers over
this process's :class:`~agent_client.ToolClient`; both protocol eras mcp 2.x speaks are
served: the ``initialize`` handshake (2025 versions) and per-request envelopes
(2026-07-28).

``tools/list`` is what ``remote_tools()`` gives: each tool's name, description and JSON
Schema (``inputSchema``), with ``idempotentHint`` for idempotent tools. A watcher reads the
catalog every heartbeat interval and, when a tool appears, disappears or its spec
changes (a worker joined or left), sends ``notifications/tools/list_changed``
(``tools.listChanged`` is advertised): to every handshake-era session that has made a
request, and to every 2026 client listening through ``subscriptions/listen``.

``tools/call`` runs ``RemoteTool.invoke``, so arguments are validated in the proxy
before anything is sent. A result comes back as ``structuredContent``, which MCP
requires to be an object: a dict result is used as it is, anything else is wrapped as
``{"result": value}``; a text block carries the same object as JSON.

(a) Runs. The run id is ``_meta["toolexec/run_id"]`` of the request when the client
sets one (:data:`RUN_ID_META_KEY`; the ``toolexec/`` prefix is ours, not one MCP
reserves); otherwise one run per MCP session: the stdio server process, or one HTTP
session (``Mcp-Session-Id``). So a client that repeats an idempotent call in one
session shares one execution, and another session runs it again. A 2026-07-28 HTTP
client has no session, so each of its calls is its own run unless it sets the key.

(b) Deadlines. MCP carries no tool timeout; a client sets one per call with
``_meta["toolexec/timeout"]`` (:data:`TIMEOUT_META_KEY`: seconds, or ``"none"`` for no
deadline; null means the same, but mcp's Python client drops null ``_meta`` values).
Otherwise the tool's ``@tool(timeout=)`` applies, then ``TOOLEXEC_DEFAULT_TIMEOUT``.
The deadline counts from when the request reached the server: a catalog read for a
tool not yet in the cached view is part of it, and the call gets what is left. Keep it
below the client's own read timeout, so the model reads our error.

(c) Errors. Every :class:`~agent_client.RemoteToolError` (invalid arguments naming each
field, ``tool 'x' timed out after 0.5s``, the remote type and message of a tool that
raised, a tool no worker serves, a lost worker, Redis unreachable) and a bad ``_meta``
value come back as a result with ``isError: true``, the message as text and
``{"error": {"type": ..., "message": ...}}`` as ``structuredContent``, never as a
protocol error; the server keeps serving. Only ``tools/list`` with Redis unreachable
answers a protocol error: there is no list to give.

Progress: a request with ``_meta.progressToken`` gets ``notifications/progress`` for
each report the tool makes (``executor.report_progress``), before its result: ``progress``
is the tool's ``done``, with its ``total`` and ``message``. MCP wants ``progress`` to
increase, so a report that does not go beyond the last one sent is not forwarded.

No Redis read blocks the server's event loop: the catalog is read on the client's I/O
thread and awaited (at most ``agent_client.catalog.READ_TIMEOUT`` each, and for a call
at most what is left of its deadline), so with Redis frozen or slow ``ping`` still
answers at once, a call still ends at its deadline, and only ``tools/list`` waits for
its bounded read. A call whose deadline ends the read is ``BrokerUnavailable`` (not
sent); the tool's own ``@tool(timeout=)``, unknown until its spec is read, counts from
the request too, so a read that outlasted it ends the call at once.

This module imports mcp (the ``toolexec[mcp]`` extra); ``toolexec mcp`` imports it.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from agent_client.frameworks import require

require("mcp", extra="mcp", framework="toolexec mcp (the MCP server)")

import anyio  # after require(), which names the extra if mcp is missing
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.server.session import ServerSession
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    ToolsListChanged,
)
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.requests import Request

from agent_client import BrokerUnavailable, ProgressEvent, RemoteTool, RemoteToolError, ToolClient
from agent_client.catalog import READ_TIMEOUT
from agent_client.deadline import NOT_SET, Timeout, check_timeout
from wire.settings import Settings

__all__ = [
    # Serving
    "ToolexecMCP",
    "serve_http",
    "serve_stdio",
    # What a client sets and gets
    "RUN_ID_META_KEY",
    "TIMEOUT_META_KEY",
    "structured",
    # Limits and seams
    "MAX_SESSIONS",
    "ProgressForwarder",
    "progress_forwarder",
]

logger = logging.getLogger(__name__)

#: Request ``_meta`` key: the toolexec run this call belongs to (a non-empty string).
RUN_ID_META_KEY = "toolexec/run_id"
#: Request ``_meta`` key: this call's deadline in seconds, or "none" (or null) for no deadline.
TIMEOUT_META_KEY = "toolexec/timeout"

#: Sessions remembered at most (mcp's HTTP transport keeps as many open by default).
MAX_SESSIONS = 10_000
#: Seconds one list_changed notification may take to reach one session.
_NOTIFY_TIMEOUT = 5.0

_Context = ServerRequestContext[Any, Any]
#: Forwards (progress, total, message) to the client; see :func:`progress_forwarder`.
ProgressForwarder = Callable[[float, float | None, str | None], Awaitable[None]]


class _MetaInvalid(ValueError):
    """A toolexec ``_meta`` value of the request is malformed."""


class _Session:
    """What the server keeps about one MCP session: its run and how to notify it."""

    def __init__(self) -> None:
        self.run_id = uuid.uuid4().hex
        self.handle: ServerSession | None = None


class _ListChangingServer(Server[None]):
    """mcp's low-level ``Server`` whose ``initialize`` advertises ``tools.listChanged``.

    mcp asks ``create_initialization_options()`` with no options on every path
    (stdio, and each streamable HTTP session), so the default is changed here.
    """

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        """The server's options, with ``tools_changed`` unless told otherwise."""
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True),
            experimental_capabilities,
            extensions,
        )


class ToolexecMCP:
    """The MCP server over one :class:`ToolClient`; :func:`serve_stdio` and :func:`serve_http` run it.

    Args:
        client: The client that reads the catalog and runs the calls.
        session_key: The session key of requests that carry no ``Mcp-Session-Id``:
            ``"stdio"`` for the stdio server (its one client), None over HTTP (no session).
    """

    def __init__(self, client: ToolClient, *, session_key: str | None) -> None:
        self.client = client
        self._default_key = session_key
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._bus = InMemorySubscriptionBus()
        self._listen = ListenHandler(self._bus)
        self.server: Server[None] = _ListChangingServer(
            "toolexec",
            version=_version(),
            instructions="Tools that run on toolexec's Celery workers; the list follows the live workers.",
            lifespan=self._lifespan,
            get_tool_input_schema=self._input_schema,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=self._listen,
        )

    # -- handlers ------------------------------------------------------------------

    async def _list_tools(
        self, ctx: _Context, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        self._session(ctx)
        try:
            specs = await self.client.catalog.specs_async()
        except RemoteToolError as exc:  # BrokerUnavailable: there is no list to give
            raise MCPError(types.INTERNAL_ERROR, str(exc)) from exc
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=spec.name,
                    description=spec.description,
                    input_schema=spec.parameters,
                    annotations=types.ToolAnnotations(idempotent_hint=True)
                    if spec.idempotent
                    else None,
                )
                for spec in specs
            ]
        )

    async def _call_tool(
        self, ctx: _Context, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        arrived = time.monotonic()  # the call's deadline counts from here, a catalog read included
        session = self._session(ctx)
        meta: Mapping[str, Any] = params.meta or {}
        try:
            timeout = _meta_timeout(meta)
            run_id = _meta_run_id(meta) or (session.run_id if session is not None else None)
            remote = await self._proxy(params.name, timeout, arrived)
            forward = progress_forwarder(ctx)
            result = await remote.invoke(
                params.arguments or {}, timeout=timeout, run_id=run_id, started=arrived,
                on_progress=None if forward is None else _forward_progress(forward),
            )  # fmt: skip
        except (RemoteToolError, _MetaInvalid) as exc:
            logger.debug("tools/call %r: %s", params.name, type(exc).__name__)
            return _error_result(exc)
        except Exception as exc:  # a toolexec bug must not end the session either
            logger.error(
                "tools/call %r failed inside toolexec: %s", params.name, type(exc).__name__
            )
            logger.debug("tools/call %r failed inside toolexec", params.name, exc_info=True)
            return _error_result(exc)
        content = structured(result)
        return types.CallToolResult(
            content=[types.TextContent(text=json.dumps(content, ensure_ascii=False))],
            structured_content=content,
        )

    async def _proxy(self, name: str, timeout: Timeout, arrived: float) -> RemoteTool:
        """The proxy for ``name``, without blocking the loop.

        From the cached view when a live worker serves the tool there (no I/O; a stale
        view is read again in the background); else read now, awaited, within the
        catalog's read bound and what is left of the call's deadline, which counts
        from ``arrived``. The call then gets only the rest of it (``invoke(started=)``).

        Raises:
            BrokerUnavailable: The catalog could not be read, or not within the deadline
                (the call was not sent).
        """
        catalog = self.client.catalog
        spec = catalog.known(name)
        if spec is not None and name in catalog.available(read=False):
            return RemoteTool(spec, client=self.client)
        # The deadline as far as it is known before the read: the call's own, else that
        # of the spec last seen (a tool no worker served then), else only the read bound.
        limit = (
            timeout
            if spec is None
            else RemoteTool(spec, client=self.client).effective_timeout(timeout)
        )
        ends = None if limit is NOT_SET or limit is None else arrived + limit
        bound = (
            READ_TIMEOUT if ends is None else max(0.0, min(READ_TIMEOUT, ends - time.monotonic()))
        )
        try:
            spec = await catalog.spec_async(name, timeout=bound)
        except BrokerUnavailable:
            if ends is None or time.monotonic() < ends:
                raise
            raise BrokerUnavailable(
                f"cannot send the call to {name!r}: the tool catalog could not be read from Redis "
                f"within its {ends - arrived:g}s deadline; the call was not sent",
                tool=name,
            ) from None
        return RemoteTool(spec, client=self.client)

    def _input_schema(self, name: str) -> Mapping[str, Any] | None:
        # mcp calls this synchronously on the loop (Mcp-Param header checks), so it reads
        # only the cached view; None skips the check, and the proxy validates anyway.
        spec = self.client.catalog.known(name)
        return None if spec is None else spec.parameters

    # -- sessions --------------------------------------------------------------------

    def _session(self, ctx: _Context) -> _Session | None:
        """The request's session (remembered from now on), or None if it has none."""
        key = self._default_key
        if isinstance(ctx.request, Request):
            key = ctx.request.headers.get("mcp-session-id") or None
        if key is None:
            return None
        session = self._sessions.get(key)
        if session is None:
            session = self._sessions[key] = _Session()
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        self._sessions.move_to_end(key)
        if session.handle is None and ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            # A handshake-era session: its ServerSession reaches the connection's
            # standalone channel, so list_changed can be sent on it later.
            session.handle = ctx.session
        return session

    # -- following the catalog -----------------------------------------------------

    @asynccontextmanager
    async def _lifespan(self, _: Server[None]) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._watch_catalog)
            try:
                yield None
            finally:
                self._listen.close()
                tasks.cancel_scope.cancel()

    async def _catalog_state(self) -> tuple[str, ...] | None:
        """Every live tool's spec, or None if Redis cannot be read right now (awaited)."""
        self.client.catalog.invalidate()
        try:
            return tuple(spec.model_dump_json() for spec in await self.client.catalog.specs_async())
        except RemoteToolError as exc:
            logger.warning("cannot read the tool catalog: %s", exc)
            return None

    async def _watch_catalog(self) -> None:
        """Announce a changed tool list, read every heartbeat interval, until cancelled."""
        seen = await self._catalog_state()
        while True:
            await anyio.sleep(self.client.settings.heartbeat_interval)
            now = await self._catalog_state()
            if now is None:
                continue
            if seen is not None and now != seen:
                logger.info("the tool catalog changed: notifying MCP clients")
                await self.announce_tools_changed()
            seen = now

    async def announce_tools_changed(self) -> None:
        """Send ``notifications/tools/list_changed`` to every session that can receive it."""
        await self._bus.publish(ToolsListChanged())
        for key, session in list(self._sessions.items()):
            if session.handle is None:
                continue
            try:
                with anyio.fail_after(_NOTIFY_TIMEOUT):
                    await session.handle.send_tool_list_changed()
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, TimeoutError):
                # The session is gone (or not reading): forget it.
                self._sessions.pop(key, None)
            except Exception:  # one session's failure must not keep the others uninformed
                logger.warning("could not notify an MCP session; forgetting it", exc_info=True)
                self._sessions.pop(key, None)


# -- results ----------------------------------------------------------------------------


def structured(result: Any) -> dict[str, Any]:
    """A tool's result as MCP ``structuredContent``: a dict as is, else ``{"result": value}``."""
    return result if isinstance(result, dict) else {"result": result}


def _error_result(exc: Exception) -> types.CallToolResult:
    message = (
        str(exc) if isinstance(exc, RemoteToolError | _MetaInvalid) else f"toolexec failed: {exc}"
    )
    return types.CallToolResult(
        content=[types.TextContent(text=message)],
        structured_content={"error": {"type": type(exc).__name__, "message": message}},
        is_error=True,
    )


def _meta_timeout(meta: Mapping[str, Any]) -> Timeout:
    if TIMEOUT_META_KEY not in meta:
        return NOT_SET
    value = meta[TIMEOUT_META_KEY]
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    try:
        return check_timeout(value)
    except ValueError:
        raise _MetaInvalid(
            f"_meta[{TIMEOUT_META_KEY!r}] must be a positive number of seconds, "
            f"or 'none' for no deadline; got {value!r}"
        ) from None


def _meta_run_id(meta: Mapping[str, Any]) -> str | None:
    value = meta.get(RUN_ID_META_KEY)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise _MetaInvalid(f"_meta[{RUN_ID_META_KEY!r}] must be a non-empty string; got {value!r}")
    return value


def progress_forwarder(ctx: _Context) -> ProgressForwarder | None:
    """The callback that forwards a tool's progress to the client, or None if it asked for none.

    A client asks with ``_meta.progressToken``, and this returns what sends
    ``notifications/progress`` against that token; ``tools/call`` hands each of the
    tool's reports to it through :func:`_forward_progress`.
    """
    meta: Mapping[str, Any] = ctx.meta or {}  # mcp parses progressToken as progress_token
    if meta.get("progress_token") is None:
        return None
    return ctx.session.report_progress


def _forward_progress(forward: ProgressForwarder) -> Callable[[ProgressEvent], Awaitable[None]]:
    """``RemoteTool.invoke``'s ``on_progress``: each report that goes beyond the last, forwarded."""
    sent: list[float] = []

    async def on_progress(event: ProgressEvent) -> None:
        if sent and event.done <= sent[-1]:
            return
        sent[:] = [event.done]
        await forward(event.done, event.total, event.message)

    return on_progress


def _version() -> str:
    try:
        return version("toolexec")
    except PackageNotFoundError:
        return "0"


# -- serving ------------------------------------------------------------------------------


def serve_stdio(settings: Settings) -> int:
    """Serve the catalog over stdin/stdout until the client closes stdin."""
    client = ToolClient(settings)
    try:
        bridge = ToolexecMCP(client, session_key="stdio")

        async def run() -> None:
            async with stdio_server() as (read, write):
                await bridge.server.run(read, write, bridge.server.create_initialization_options())

        anyio.run(run)
    finally:
        client.close()
    return 0


def serve_http(settings: Settings, host: str = "127.0.0.1", port: int = 8000) -> int:
    """Serve the catalog over streamable HTTP at ``http://HOST:PORT/mcp`` until SIGINT/SIGTERM."""
    import uvicorn

    client = ToolClient(settings)
    try:
        bridge = ToolexecMCP(client, session_key=None)
        app = bridge.server.streamable_http_app(host=host)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
        print(
            f"toolexec mcp: serving on http://{_url_host(host)}:{port}/mcp",
            file=sys.stderr,
            flush=True,
        )
        uvicorn.Server(config).run()
    finally:
        client.close()
    return 0


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
