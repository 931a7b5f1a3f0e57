"""``tools/call``: one call through ``RemoteTool.invoke``, and its result as MCP content.

Arguments are validated in the proxy before anything is sent. A result comes back as
``structuredContent``, which MCP requires to be an object: a dict result is used as it
is, anything else is wrapped as ``{"result": value}`` (:func:`structured`); a text
block carries the same object as JSON.

(c) Errors. Every :class:`~agent_client.RemoteToolError` (invalid arguments naming each
field, ``tool 'x' timed out after 0.5s``, the remote type and message of a tool that
raised, a tool no worker serves, a lost worker, Redis unreachable) and a bad ``_meta``
value (:mod:`toolexec.mcp.meta`) come back as a result with ``isError: true``, the
message as text and ``{"error": {"type": ..., "message": ...}}`` as
``structuredContent``, never as a protocol error; the server keeps serving. Every
result of a call that was sent names it in ``_meta["toolexec/call_id"]``
(:data:`~toolexec.mcp.meta.CALL_ID_META_KEY`), for ``toolexec cancel`` and the logs.

No Redis read blocks the server's event loop: the catalog is read on the client's I/O
thread and awaited (at most ``agent_client.catalog.READ_TIMEOUT`` each, and for a call
at most what is left of its deadline), so with Redis frozen or slow ``ping`` still
answers at once and a call still ends at its deadline. A call whose deadline ends the
read is ``BrokerUnavailable`` (not sent); the tool's own ``@tool(timeout=)``, unknown
until its spec is read, counts from the request too, so a read that outlasted it ends
the call at once.

(d) Tasks. A 2026-07-28 request that declares MCP's tasks extension gets a task in
place of the result (:mod:`toolexec.mcp.tasks`): the call is submitted instead of
awaited, after the same checks; everything else above holds for it.

(e) Approval. A tool that requires approval is sent only once the host's user approved
the call through MCP elicitation (:mod:`toolexec.mcp.approval`); declined, cancelled, or
a host that cannot be asked: an error result, and the call never reaches a worker.

(f) Cancellation. A client's ``notifications/cancelled`` for a ``tools/call`` (what
the mcp client sends when it abandons a request: its task cancelled, or its
``read_timeout_seconds`` passed; at 2026-07-28 over HTTP, the aborted POST) makes mcp
cancel the request's handler, and the ``CancelledError`` reaches ``invoke`` untouched
(only ``Exception`` is turned into an error result): the caller abandons the call, so
a tool declared ``@tool(on_abandon="cancel")`` is stopped on its worker, and one that
leaves it (the default) runs on. The cancelled request is not answered, as MCP says.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import mcp_types as types

from agent_client import BrokerUnavailable, RemoteTool, RemoteToolError, ToolClient, sent_calls
from agent_client.catalog import READ_TIMEOUT
from agent_client.deadline import NOT_SET, Timeout
from toolexec.mcp.approval import Refused, approval
from toolexec.mcp.meta import CALL_ID_META_KEY, Context, MetaInvalid, meta_run_id, meta_timeout
from toolexec.mcp.progress import forward_progress, progress_forwarder
from toolexec.mcp.tasks import TaskStore

__all__ = ["call_tool", "structured", "tool_result"]

logger = logging.getLogger(__name__)


async def call_tool(
    client: ToolClient,
    ctx: Context,
    params: types.CallToolRequestParams,
    *,
    session_run_id: str | None,
    arrived: float,
    tasks: TaskStore | None = None,
    approve_all: bool = False,
) -> types.CallToolResult | types.InputRequiredResult | dict[str, Any]:
    """Run the call ``params`` asks for and answer it; every failure is an error result.

    Args:
        client: The client that reads the catalog and runs the call.
        ctx: The request's context (its progress token).
        params: The request.
        session_run_id: The run of the request's session, if it has one.
        arrived: When the request reached the server (``time.monotonic()``): the
            call's deadline counts from there, a catalog read included.
        tasks: Where to submit the call as a task (the request declares the tasks
            extension), or None to run it and answer with its result.
        approve_all: Send calls of tools that require approval without asking the host
            (``toolexec mcp --approve-all``; :mod:`toolexec.mcp.approval`).
    """
    meta: Mapping[str, Any] = params.meta or {}
    try:
        timeout = meta_timeout(meta)
        run_id = meta_run_id(meta) or session_run_id
        remote = await _proxy(client, params.name, timeout, arrived)
        if remote.requires_approval:
            asked = await approval(ctx, params, approve_all=approve_all)
            if asked is not None:
                return asked  # the host asks its user, and sends the call again with the answer
        if tasks is not None:
            return await tasks.start(
                remote, params.arguments or {}, timeout=timeout, run_id=run_id, started=arrived
            )
        forward = progress_forwarder(ctx)
        with sent_calls() as sent:
            result = await remote.invoke(
                params.arguments or {},
                timeout=timeout,
                run_id=run_id,
                started=arrived,
                on_progress=None if forward is None else forward_progress(forward),
            )
    except (RemoteToolError, MetaInvalid, Refused) as exc:
        logger.debug("tools/call %r: %s", params.name, type(exc).__name__)
        return _error_result(exc)
    except Exception as exc:  # a toolexec bug must not end the session either
        logger.error("tools/call %r failed inside toolexec: %s", params.name, type(exc).__name__)
        logger.debug("tools/call %r failed inside toolexec", params.name, exc_info=True)
        return _error_result(exc)
    return tool_result(result, None, call_id=sent[-1].call_id if sent else None)


def tool_result(
    value: Any, error: BaseException | None, *, call_id: str | None = None
) -> types.CallToolResult:
    """The ``CallToolResult`` of a call that returned ``value``, or failed with ``error``;
    its ``_meta`` names the call (:data:`CALL_ID_META_KEY`) when there was one."""
    if error is not None:
        return _error_result(error)
    content = structured(value)
    return types.CallToolResult(
        content=[types.TextContent(text=json.dumps(content, ensure_ascii=False))],
        structured_content=content,
        _meta={CALL_ID_META_KEY: call_id} if call_id else None,
    )


async def _proxy(client: ToolClient, name: str, timeout: Timeout, arrived: float) -> RemoteTool:
    """The proxy for ``name``, without blocking the loop.

    From the cached view when a live worker serves the tool there (no I/O; a stale
    view is read again in the background); else read now, awaited, within the
    catalog's read bound and what is left of the call's deadline, which counts
    from ``arrived``. The call then gets only the rest of it (``invoke(started=)``).

    Raises:
        BrokerUnavailable: The catalog could not be read, or not within the deadline
            (the call was not sent).
    """
    catalog = client.catalog
    spec = catalog.known(name)
    if spec is not None and name in catalog.available(read=False):
        return RemoteTool(spec, client=client)
    # The deadline as far as it is known before the read: the call's own, else that
    # of the spec last seen (a tool no worker served then), else only the read bound.
    limit = timeout if spec is None else RemoteTool(spec, client=client).effective_timeout(timeout)
    ends = None if limit is NOT_SET or limit is None else arrived + limit
    bound = READ_TIMEOUT if ends is None else max(0.0, min(READ_TIMEOUT, ends - time.monotonic()))
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
    return RemoteTool(spec, client=client)


def structured(result: Any) -> dict[str, Any]:
    """A tool's result as MCP ``structuredContent``: a dict as is, else ``{"result": value}``."""
    return result if isinstance(result, dict) else {"result": result}


def _error_result(exc: BaseException) -> types.CallToolResult:
    message = (
        str(exc) if isinstance(exc, RemoteToolError | MetaInvalid) else f"toolexec failed: {exc}"
    )
    call_id = exc.call_id if isinstance(exc, RemoteToolError) else None
    return types.CallToolResult(
        content=[types.TextContent(text=message)],
        structured_content={"error": {"type": type(exc).__name__, "message": message}},
        is_error=True,
        _meta={CALL_ID_META_KEY: call_id} if call_id else None,
    )
