"""The MCP server over one :class:`~agent_client.ToolClient`, and running it over stdio or HTTP.

:class:`ToolexecMCP` is mcp's low-level ``Server`` with its handlers: ``tools/list``
and the catalog watcher (:mod:`toolexec.mcp.listing`), ``tools/call``
(:mod:`toolexec.mcp.calling`), the sessions (:mod:`toolexec.mcp.sessions`),
``subscriptions/listen``, and MCP's tasks extension (:mod:`toolexec.mcp.tasks`,
:mod:`toolexec.mcp.task_requests`). It advertises ``tools.listChanged`` and, when the
list changes, notifies every handshake-era session that has made a request and every
2026 client listening through ``subscriptions/listen``; to 2026 clients
(``server/discover``) it advertises the tasks extension too. :func:`serve_stdio` and
:func:`serve_http` run it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ToolsListChanged
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from agent_client import ToolClient
from toolexec.mcp.calling import call_tool, tool_result
from toolexec.mcp.listing import input_schema, list_tools, watch_catalog
from toolexec.mcp.meta import Context
from toolexec.mcp.sessions import Sessions
from toolexec.mcp.task_requests import TaskRequests
from toolexec.mcp.tasks import TASKS_EXTENSION, TaskStore, declares_tasks
from wire.settings import Settings

__all__ = ["ToolexecMCP", "serve_http", "serve_stdio"]


class _ListChangingServer(Server[None]):
    """mcp's low-level ``Server`` whose ``initialize`` advertises ``tools.listChanged``,
    and whose ``server/discover`` advertises the tasks extension.

    mcp asks ``create_initialization_options()`` with no options on every path
    (stdio, and each streamable HTTP session), so the default is changed here. The
    extension is not defined in the handshake era, so ``initialize`` does not name it.
    """

    def get_capabilities(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        *,
        protocol_version: str | None = None,
    ) -> types.ServerCapabilities:
        """The server's capabilities; at 2026-07-28 versions, with the tasks extension."""
        if protocol_version in MODERN_PROTOCOL_VERSIONS:
            extensions = {**(extensions or self.extensions), TASKS_EXTENSION: {}}
        return super().get_capabilities(
            notification_options,
            experimental_capabilities,
            extensions,
            protocol_version=protocol_version,
        )

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
    """The MCP server over one :class:`ToolClient`; :func:`serve_stdio` and
    :func:`serve_http` run it.

    Args:
        client: The client that reads the catalog and runs the calls.
        session_key: The session key of requests that carry no ``Mcp-Session-Id``:
            ``"stdio"`` for the stdio server (its one client), None over HTTP (no session).
        approve_all: Send the calls of tools that require approval without asking the
            host (``toolexec mcp --approve-all``).
    """

    def __init__(
        self, client: ToolClient, *, session_key: str | None, approve_all: bool = False
    ) -> None:
        self.client = client
        self.approve_all = approve_all
        self._sessions = Sessions(session_key)
        self._bus = InMemorySubscriptionBus()
        self.tasks = TaskStore(client, tool_result)
        self._task_requests = TaskRequests(self.tasks, self._bus)
        self.server: Server[None] = _ListChangingServer(
            "toolexec",
            version=_version(),
            instructions=(
                "Tools that run on toolexec's Celery workers; the list follows the live workers."
            ),
            lifespan=self._lifespan,
            get_tool_input_schema=self._input_schema,
            on_list_tools=self._list_tools,
        )
        # Registered here, not as on_call_tool: a task is not a CallToolResult.
        self.server.add_request_handler("tools/call", types.CallToolRequestParams, self._call_tool)
        self._task_requests.register(self.server)

    async def _list_tools(
        self, ctx: Context, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        self._sessions.of(ctx)
        return await list_tools(self.client)

    async def _call_tool(
        self, ctx: Context, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult | dict[str, Any]:
        arrived = time.monotonic()  # the call's deadline counts from here, a catalog read included
        session = self._sessions.of(ctx)
        return await call_tool(
            self.client,
            ctx,
            params,
            session_run_id=session.run_id if session is not None else None,
            arrived=arrived,
            tasks=self.tasks if declares_tasks(ctx) else None,
            approve_all=self.approve_all,
        )

    def _input_schema(self, name: str) -> Mapping[str, Any] | None:
        return input_schema(self.client, name)

    @asynccontextmanager
    async def _lifespan(self, _: Server[None]) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(watch_catalog, self.client, self.announce_tools_changed)
            tasks.start_soon(self.tasks.run)
            try:
                yield None
            finally:
                self._task_requests.close()
                tasks.cancel_scope.cancel()

    async def announce_tools_changed(self) -> None:
        """Send ``notifications/tools/list_changed`` to every session that can receive it."""
        await self._bus.publish(ToolsListChanged())
        await self._sessions.send_tool_list_changed()


def _version() -> str:
    try:
        return version("toolexec")
    except PackageNotFoundError:
        return "0"


def serve_stdio(settings: Settings, *, approve_all: bool = False) -> int:
    """Serve the catalog over stdin/stdout until the client closes stdin."""
    client = ToolClient(settings)
    try:
        bridge = ToolexecMCP(client, session_key="stdio", approve_all=approve_all)

        async def run() -> None:
            async with stdio_server() as (read, write):
                await bridge.server.run(read, write, bridge.server.create_initialization_options())

        anyio.run(run)
    finally:
        client.close()
    return 0


def serve_http(
    settings: Settings, host: str = "127.0.0.1", port: int = 8000, *, approve_all: bool = False
) -> int:
    """Serve the catalog over streamable HTTP at ``http://HOST:PORT/mcp`` until SIGINT/SIGTERM."""
    import uvicorn

    client = ToolClient(settings)
    try:
        bridge = ToolexecMCP(client, session_key=None, approve_all=approve_all)
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
