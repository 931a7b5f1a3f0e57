"""``requires_approval`` over MCP: the host's user approves each call before it is sent.

A tool declared ``@tool(requires_approval=True)`` never reaches a worker on a bare
``tools/call``: the server first asks the host through MCP elicitation (a form with no
fields, its message naming the tool and its arguments), and sends the call only when the
answer is ``accept``. ``decline`` or ``cancel`` ends the call with an error result that
says so; it never reaches a worker.

* A handshake-era session (2025 protocol versions) is asked with ``elicitation/create``
  on its own connection, while the ``tools/call`` waits.
* A 2026-07-28 request is answered with an ``InputRequiredResult`` carrying the
  elicitation (SEP-2322): the host asks its user and sends the ``tools/call`` again with
  the answer (``inputResponses``) and the echoed ``requestState``, which names the tool
  and a digest of the arguments, so an answer approves exactly the call it was asked for.
* A host that did not declare the elicitation capability gets a clear refusal, unless the
  operator started the server with ``toolexec mcp --approve-all`` (the operator approves
  every call; nobody is asked).

``tools/list`` marks such a tool ``readOnlyHint: false`` (its calls change something a
person should approve) beside its ``_meta["toolexec/requires_approval"]``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from toolexec.mcp.meta import Context

__all__ = ["APPROVAL_INPUT_KEY", "Refused", "approval"]

logger = logging.getLogger(__name__)

#: The key of the approval's elicitation among a request's ``inputRequests``.
APPROVAL_INPUT_KEY = "toolexec/approval"
#: An approval form asks for nothing but the answer itself.
_NO_FIELDS: dict[str, Any] = {"type": "object", "properties": {}}
#: Arguments shown to the person at most (the rest elided).
_SHOWN_ARGUMENTS = 2000


class Refused(Exception):
    """The call was not approved: declined, cancelled, or nobody could be asked."""


async def approval(
    ctx: Context, params: types.CallToolRequestParams, *, approve_all: bool
) -> types.InputRequiredResult | None:
    """Ask the host to approve the call ``params``; None once it is approved.

    Returns the ``InputRequiredResult`` to answer a 2026-07-28 request with while its
    answer is not in the request yet.

    Raises:
        Refused: Declined, cancelled, or the host cannot be asked (no elicitation).
    """
    if approve_all:
        return None
    arguments = params.arguments or {}
    message = _message(params.name, arguments)
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        state = _state(params.name, arguments)
        answer = (params.input_responses or {}).get(APPROVAL_INPUT_KEY)
        if answer is None or params.request_state != state:
            _require_elicitation(ctx, params.name)
            request = types.ElicitRequest(
                params=types.ElicitRequestFormParams(message=message, requested_schema=_NO_FIELDS)
            )
            return types.InputRequiredResult(
                input_requests={APPROVAL_INPUT_KEY: request}, request_state=state
            )
        _check(params.name, _action(answer))
        return None
    _require_elicitation(ctx, params.name)
    try:
        result = await ctx.session.elicit_form(
            message, _NO_FIELDS, related_request_id=ctx.request_id
        )
    except MCPError as exc:
        raise Refused(
            f"tool {params.name!r} requires approval, and the host did not answer the request for "
            f"it ({exc}); the call was not sent"
        ) from None
    _check(params.name, result.action)
    return None


def _require_elicitation(ctx: Context, tool: str) -> None:
    capabilities = ctx.session.client_capabilities
    if capabilities is None or capabilities.elicitation is None:
        raise Refused(
            f"tool {tool!r} requires approval, and this MCP client cannot be asked for it (it "
            "declares no elicitation capability); the call was not sent. Use a host that supports "
            "elicitation, or have the operator start the server with `toolexec mcp --approve-all`"
        )


def _check(tool: str, action: str | None) -> None:
    if action == "accept":
        return
    said = {"decline": "declined", "cancel": "cancelled"}.get(
        action or "", f"answered {action!r} to"
    )
    logger.info("tools/call %r: the user %s its approval; not sent", tool, said)
    raise Refused(f"the user {said} the approval of this call to {tool!r}; it was not run")


def _action(answer: Any) -> str | None:
    action = (
        answer.get("action") if isinstance(answer, Mapping) else getattr(answer, "action", None)
    )
    return action if isinstance(action, str) else None


def _message(tool: str, arguments: Mapping[str, Any]) -> str:
    shown = json.dumps(arguments, ensure_ascii=False, sort_keys=True, default=str)
    if len(shown) > _SHOWN_ARGUMENTS:
        shown = shown[:_SHOWN_ARGUMENTS] + " …"
    return f"Approve a call to the tool {tool!r} with these arguments? {shown}"


def _state(tool: str, arguments: Mapping[str, Any]) -> str:
    """The ``requestState`` an answer must echo: the tool and a digest of its arguments."""
    text = json.dumps(arguments, ensure_ascii=False, sort_keys=True, default=str)
    return f"approve:{tool}:{hashlib.sha256(text.encode()).hexdigest()}"
