"""What a ``tools/call`` request may carry in its ``_meta``: its toolexec run and its deadline.

(a) Runs. The run id is ``_meta["toolexec/run_id"]`` of the request when the client
sets one (:data:`RUN_ID_META_KEY`; the ``toolexec/`` prefix is ours, not one MCP
reserves); otherwise one run per MCP session (:mod:`toolexec.mcp.sessions`): the stdio
server process, or one HTTP session (``Mcp-Session-Id``). So a client that repeats an
idempotent call in one session shares one execution, and another session runs it
again. A 2026-07-28 HTTP client has no session, so each of its calls is its own run
unless it sets the key.

(b) Deadlines. MCP carries no tool timeout; a client sets one per call with
``_meta["toolexec/timeout"]`` (:data:`TIMEOUT_META_KEY`: seconds, or ``"none"`` for no
deadline; null means the same, but mcp's Python client drops null ``_meta`` values).
Otherwise the tool's ``@tool(timeout=)`` applies, then ``TOOLEXEC_DEFAULT_TIMEOUT``.
The deadline counts from when the request reached the server: a catalog read for a
tool not yet in the cached view is part of it, and the call gets what is left. Keep it
below the client's own read timeout, so the model reads our error.

A malformed value is :class:`MetaInvalid`, which the call answers as an error result.

(c) Approval. A tool that requires approval (``@tool(requires_approval=True)``) is
listed with ``_meta["toolexec/requires_approval"]: true``
(:data:`REQUIRES_APPROVAL_META_KEY`) and ``readOnlyHint: false``. MCP's tool annotations
have no approval hint, and mcp's clients drop an annotation they do not know, so it
travels in the tool's ``_meta``, which they keep. The server itself asks the host to
approve each call through elicitation before it sends it (:mod:`toolexec.mcp.approval`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp.server.context import ServerRequestContext

from agent_client.deadline import NOT_SET, Timeout, check_timeout

__all__ = [
    "CALL_ID_META_KEY",
    "REQUIRES_APPROVAL_META_KEY",
    "RUN_ID_META_KEY",
    "TIMEOUT_META_KEY",
    "Context",
    "MetaInvalid",
    "meta_run_id",
    "meta_timeout",
]

#: Request ``_meta`` key: the toolexec run this call belongs to (a non-empty string).
RUN_ID_META_KEY = "toolexec/run_id"
#: Request ``_meta`` key: this call's deadline in seconds, or "none" (or null) for no deadline.
TIMEOUT_META_KEY = "toolexec/timeout"

#: Result ``_meta`` key (``tools/call``): the id of the toolexec call that answered.
CALL_ID_META_KEY = "toolexec/call_id"

#: Tool ``_meta`` key (``tools/list``): true when a person should approve each call first.
REQUIRES_APPROVAL_META_KEY = "toolexec/requires_approval"

#: The context mcp hands each request handler.
Context = ServerRequestContext[Any, Any]


class MetaInvalid(ValueError):
    """A toolexec ``_meta`` value of the request is malformed."""


def meta_timeout(meta: Mapping[str, Any]) -> Timeout:
    """The call's deadline from ``_meta`` (:data:`TIMEOUT_META_KEY`); NOT_SET when it sets none.

    Raises:
        MetaInvalid: The value is neither a positive number of seconds nor "none" (or null).
    """
    if TIMEOUT_META_KEY not in meta:
        return NOT_SET
    value = meta[TIMEOUT_META_KEY]
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    try:
        return check_timeout(value)
    except ValueError:
        raise MetaInvalid(
            f"_meta[{TIMEOUT_META_KEY!r}] must be a positive number of seconds, "
            f"or 'none' for no deadline; got {value!r}"
        ) from None


def meta_run_id(meta: Mapping[str, Any]) -> str | None:
    """The call's run id from ``_meta`` (:data:`RUN_ID_META_KEY`); None when it sets none.

    Raises:
        MetaInvalid: The value is not a non-empty string.
    """
    value = meta.get(RUN_ID_META_KEY)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise MetaInvalid(f"_meta[{RUN_ID_META_KEY!r}] must be a non-empty string; got {value!r}")
    return value
