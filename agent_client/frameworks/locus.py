"""locus integration: a :class:`RemoteTool` as a real ``locus`` ``Tool``.

``Agent(tools=remote_tools().as_locus())`` or ``tools=[remote_tool("search").as_locus()]``
(locus takes ``Tool`` instances only). The Tool's function is ``async``, so locus
awaits it on its own loop; no thread is used per call.

(a) Run id. An enclosing ``run_scope()`` wins, so one scope can span several locus
runs. Otherwise: locus binds a ``ToolContext`` around every tool call; the function
reads ``current_tool_context().run_id`` (one ``Agent.run``/``arun``; a new turn on a
thread is a new run) and passes it to ``invoke``: repeats of an idempotent call within
one locus run share one execution, two runs do not. With no locus run (an empty run
id) and no scope, each call is its own run.

locus reuses the earlier result of a ``Tool(idempotent=True)`` for a repeat in the
same run, errors included, without calling the function. The Tool is therefore
declared ``idempotent=False`` even for idempotent remote tools: deduplication stays
in toolexec, where a retry after a timeout joins the execution still running.

(b) Deadlines. locus has no default tool timeout, so toolexec's precedence applies:
``remote_tool(timeout=)``, ``remote_tools(default_timeout=)``, the tool's own, the
settings. A locus before-tool hook may give one call its own deadline (the call
level) through locus's invocation-only secret arguments, which are never recorded::

    event.secret_arguments = {CALL_TIMEOUT: 30.0}

(c) Errors. The function raises the :class:`RemoteToolError`; locus turns a raising
tool into the result ``Error: <type>: <first line>`` and the run goes on, e.g.
``Error: ToolTimeoutError: tool 'slow_report' timed out after 0.5s`` or
``Error: ToolArgumentsInvalid: invalid arguments for tool 'book_flight': flight_id: ...``.

This module imports locus (the ``toolexec[locus]`` extra) only when a Tool is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agent_client.deadline import NOT_SET, Timeout, check_timeout
from agent_client.frameworks import require
from agent_client.scope import current_run_id

if TYPE_CHECKING:
    from locus.tools.decorator import Tool

    from agent_client.remote import RemoteTool

__all__ = ["CALL_TIMEOUT", "locus_tool"]

#: The secret argument a before-tool hook sets to give one call its deadline. No tool
#: parameter can clash with it: toolexec schemas come from pydantic, which keeps
#: names with a leading underscore private.
CALL_TIMEOUT = "_toolexec_timeout"


def locus_tool(remote: RemoteTool) -> Tool:
    """Build the ``locus`` ``Tool`` that runs ``remote`` on a worker.

    Raises:
        MissingExtra: locus is not installed.
    """
    require("locus", extra="locus", framework="locus")
    from locus.tools.context import current_tool_context
    from locus.tools.decorator import Tool

    async def call(**arguments: Any) -> Any:
        timeout: Timeout = NOT_SET
        if CALL_TIMEOUT in arguments:
            timeout = check_timeout(arguments.pop(CALL_TIMEOUT), what=CALL_TIMEOUT)
        context = current_tool_context()
        run_id = None  # None: the enclosing run_scope(), if any
        if current_run_id() is None and context is not None and context.run_id:
            run_id = context.run_id
        # A RemoteToolError propagates: locus shows it to the model as the result.
        return await remote.invoke(arguments, timeout=timeout, run_id=run_id)

    call.__name__ = call.__qualname__ = remote.name
    call.__doc__ = remote.description
    return Tool(
        name=remote.name,
        description=remote.description,
        parameters=remote.parameters,
        fn=call,
        idempotent=False,  # locus would cache results and errors; toolexec deduplicates
    )
