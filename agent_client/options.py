"""A call's options: the keywords a proxy takes, and what it resolves them to.

Every way to call a tool (``RemoteTool.invoke``, ``invoke_sync``, ``submit``,
``submit_async``) takes the same keywords, :class:`CallKeywords`, after the arguments:
one dict, so an option never clashes with an argument's name. The proxy resolves them
once (the deadline from its levels, the run, the key, what happens to an abandoned
call) into one :class:`CallOptions`, which the client and the handle take whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from agent_client.abandon import OnAbandon
from agent_client.deadline import Timeout
from agent_client.progress import ProgressCallback

__all__ = ["CallKeywords", "CallOptions"]


class CallKeywords(TypedDict, total=False):
    """The keywords of a call, each optional.

    Attributes:
        timeout: This call's deadline in seconds (None: no deadline); wins over every
            default.
        run_id: The agent run; default: the enclosing ``run_scope()``, if any.
        idempotency_key: Use this key instead of the one derived from the run, tool
            and arguments (idempotent tools only).
        framework_timeout: The framework's default deadline (adapters set it).
        on_progress: Called with each :class:`~agent_client.progress.ProgressEvent` the
            tool reports, in order, before the call returns: on the caller's event loop
            for ``invoke`` (an awaitable it returns is awaited), on this process's
            progress thread otherwise.
        started: When the call was made (``time.monotonic()``), if before this: the
            deadline counts from then, so what the caller did first (the MCP server's
            catalog read) is part of it. If it has passed already, the call raises
            ``ToolTimeoutError`` and sends nothing.
        on_abandon: ``"cancel"`` or ``"leave"`` this call should its caller stop waiting
            (its deadline passes, its awaiting task is cancelled); None: the proxy's,
            else the tool's own (:mod:`agent_client.abandon`).
    """

    timeout: Timeout
    run_id: str | None
    idempotency_key: str | None
    framework_timeout: Timeout
    on_progress: ProgressCallback | None
    started: float | None
    on_abandon: OnAbandon | None


@dataclass(frozen=True, kw_only=True, slots=True)
class CallOptions:
    """One call's options, resolved by its proxy and passed down whole.

    Attributes:
        timeout: The deadline in seconds, resolved from its levels; None: none.
        started: When the call was made (``time.monotonic()``): the deadline counts
            from then; None: from when it is sent.
        run_id: The agent run, if given (else the enclosing ``run_scope()`` is read
            when the call is prepared).
        idempotency_key: The key given in place of the derived one.
        on_abandon: The call's own override of what happens once abandoned.
    """

    timeout: float | None
    started: float | None = None
    run_id: str | None = None
    idempotency_key: str | None = None
    on_abandon: OnAbandon | None = None
