"""The MCP sessions the server remembers: each one's toolexec run, and how to tell it
the list changed.

A session is the stdio server's one client, or one streamable HTTP session
(``Mcp-Session-Id``); a 2026-07-28 HTTP client has none. Each session is one toolexec
run (:mod:`toolexec.mcp.meta`), and a handshake-era session (2025 protocol versions)
that has made a request gets ``notifications/tools/list_changed`` on its connection's
standalone channel. At most :data:`MAX_SESSIONS` are remembered, the least recently
seen forgotten first; one that cannot be notified is forgotten.
"""

from __future__ import annotations

import logging
import uuid
from collections import OrderedDict

import anyio
from mcp.server.session import ServerSession
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.requests import Request

from toolexec.mcp.meta import Context

__all__ = ["MAX_SESSIONS", "Session", "Sessions"]

logger = logging.getLogger(__name__)

#: Sessions remembered at most (mcp's HTTP transport keeps as many open by default).
MAX_SESSIONS = 10_000
#: Seconds one list_changed notification may take to reach one session.
_NOTIFY_TIMEOUT = 5.0


class Session:
    """What the server keeps about one MCP session: its run and how to notify it."""

    def __init__(self) -> None:
        self.run_id = uuid.uuid4().hex
        self.handle: ServerSession | None = None


class Sessions:
    """The sessions seen, by key, least recently seen first.

    Args:
        default_key: The session key of requests that carry no ``Mcp-Session-Id``:
            ``"stdio"`` for the stdio server (its one client), None over HTTP (no session).
    """

    def __init__(self, default_key: str | None) -> None:
        self._default_key = default_key
        self._by_key: OrderedDict[str, Session] = OrderedDict()

    def of(self, ctx: Context) -> Session | None:
        """The request's session (remembered from now on), or None if it has none."""
        key = self._default_key
        if isinstance(ctx.request, Request):
            key = ctx.request.headers.get("mcp-session-id") or None
        if key is None:
            return None
        session = self._by_key.get(key)
        if session is None:
            session = self._by_key[key] = Session()
            while len(self._by_key) > MAX_SESSIONS:
                self._by_key.popitem(last=False)
        self._by_key.move_to_end(key)
        if session.handle is None and ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            # A handshake-era session: its ServerSession reaches the connection's
            # standalone channel, so list_changed can be sent on it later.
            session.handle = ctx.session
        return session

    async def send_tool_list_changed(self) -> None:
        """Send ``notifications/tools/list_changed`` to every handshake-era session."""
        for key, session in list(self._by_key.items()):
            if session.handle is None:
                continue
            try:
                with anyio.fail_after(_NOTIFY_TIMEOUT):
                    await session.handle.send_tool_list_changed()
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, TimeoutError):
                # The session is gone (or not reading): forget it.
                self._by_key.pop(key, None)
            except Exception:  # one session's failure must not keep the others uninformed
                logger.warning("could not notify an MCP session; forgetting it", exc_info=True)
                self._by_key.pop(key, None)
