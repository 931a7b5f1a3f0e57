"""``tools/list``, and following the catalog so that clients hear when the list changes.

``tools/list`` is what ``remote_tools()`` gives: each tool's name, description and JSON
Schema (``inputSchema``), with ``idempotentHint`` for idempotent tools, and
``readOnlyHint: false`` and ``_meta["toolexec/requires_approval"]`` for tools a person
approves (asked through elicitation before each call, :mod:`toolexec.mcp.approval`)
(:mod:`toolexec.mcp.meta`). With Redis unreachable it answers a protocol error: there is
no list to give. It waits only for the catalog's bounded read
(``agent_client.catalog.READ_TIMEOUT``), on the client's I/O thread, never blocking the
server's loop.

A watcher (:func:`watch_catalog`) reads the catalog every heartbeat interval and, when
a tool appears, disappears or its spec changes (a worker joined or left), calls the
server's announcement of ``notifications/tools/list_changed``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError

from agent_client import RemoteToolError, ToolClient
from toolexec.mcp.meta import REQUIRES_APPROVAL_META_KEY
from wire.models import ToolSpec

__all__ = ["input_schema", "list_tools", "watch_catalog"]

logger = logging.getLogger(__name__)


async def list_tools(client: ToolClient) -> types.ListToolsResult:
    """Every live tool, as ``tools/list`` answers.

    Raises:
        MCPError: The catalog could not be read (``BrokerUnavailable``).
    """
    try:
        specs = await client.catalog.specs_async()
    except RemoteToolError as exc:  # BrokerUnavailable: there is no list to give
        raise MCPError(types.INTERNAL_ERROR, str(exc)) from exc
    return types.ListToolsResult(
        tools=[
            types.Tool(
                name=spec.name,
                description=spec.description,
                input_schema=spec.parameters,
                annotations=_annotations(spec),
                _meta={REQUIRES_APPROVAL_META_KEY: True} if spec.requires_approval else None,
            )
            for spec in specs
        ]
    )


def _annotations(spec: ToolSpec) -> types.ToolAnnotations | None:
    """What ``tools/list`` says of a tool beyond its schema: idempotent; not read-only when
    a person approves each call (its calls change something)."""
    if not spec.idempotent and not spec.requires_approval:
        return None
    return types.ToolAnnotations(
        idempotent_hint=True if spec.idempotent else None,
        read_only_hint=False if spec.requires_approval else None,
    )


def input_schema(client: ToolClient, name: str) -> Mapping[str, Any] | None:
    """The JSON Schema of tool ``name`` from the cached view, or None if it is not there."""
    # mcp calls this synchronously on the loop (Mcp-Param header checks), so it reads
    # only the cached view; None skips the check, and the proxy validates anyway.
    spec = client.catalog.known(name)
    return None if spec is None else spec.parameters


async def _catalog_state(client: ToolClient) -> tuple[str, ...] | None:
    """Every live tool's spec, or None if Redis cannot be read right now (awaited)."""
    client.catalog.invalidate()
    try:
        return tuple(spec.model_dump_json() for spec in await client.catalog.specs_async())
    except RemoteToolError as exc:
        logger.warning("cannot read the tool catalog: %s", exc)
        return None


async def watch_catalog(client: ToolClient, announce: Callable[[], Awaitable[None]]) -> None:
    """Call ``announce`` when the tool list changes, read every heartbeat interval,
    until cancelled."""
    seen = await _catalog_state(client)
    while True:
        await anyio.sleep(client.settings.heartbeat_interval)
        now = await _catalog_state(client)
        if now is None:
            continue
        if seen is not None and now != seen:
            logger.info("the tool catalog changed: notifying MCP clients")
            await announce()
        seen = now
