"""openai-agents integration: a :class:`RemoteTool` as a real ``agents.FunctionTool``.

``Agent(tools=remote_tools().as_openai_agents())``, or ``[remote_tool("x").as_openai_agents()]``.
``on_invoke_tool`` is async and awaits ``RemoteTool.invoke`` on the run's loop, so the
SDK can cancel it; no thread is used per call.

(a) Run id (:func:`run_id_for`), the first that applies: 1. a run id the run's
context carries, as a ``toolexec_run_id`` (else ``run_id``) mapping key or attribute
(``Runner.run(..., context={"run_id": "..."})`` or an object with such an attribute:
your convention, e.g. to keep one run across a resumed RunState);
2. an enclosing ``run_scope()``; 3. the current trace's ``trace_id`` (``Runner.run``
opens one trace per run; runs inside a ``with trace(...)`` you opened share it, and so
are one run); 4. with tracing disabled (``set_tracing_disabled(True)``,
``OPENAI_AGENTS_DISABLE_TRACING=1``, ``RunConfig(tracing_disabled=True)``) every trace
is one ``NoOpTrace`` with the id ``"no-op"``, so instead the run's ``Usage`` object,
made per ``Runner.run`` and shared by all its tool calls, gets a fresh id (held weakly:
never reused). Repeats within one ``Runner.run`` share one execution; two runs do not.

(b) Deadlines. The SDK has no agent- or run-level tool timeout, only the per-tool
``FunctionTool.timeout_seconds``. It is left None, so toolexec's precedence decides
(call, ``remote_tool(timeout=)``, ``remote_tools(default_timeout=)``, ``@tool``,
settings). Set ``tool.timeout_seconds = 4`` and 4 s is the framework level, passed as
``framework_timeout`` so the worker knows it; the SDK also enforces it itself, so it
bounds even a larger proxy timeout.

(c) Errors. A raising ``on_invoke_tool`` fails the run and what it returns is shown to
the model, so every :class:`RemoteToolError` but a timeout is returned as text and the
run goes on: ``[INVALID_ARGUMENTS] invalid arguments for tool 'book_flight': flight_id:
...`` (also for arguments that are not a JSON object), ``[TOOL_ERROR] tool 'search'
failed: ValueError: ...``, and a call someone else cancelled (``toolexec cancel``,
``CallHandle.cancel()``) as ``[TOOL_CANCELLED] the call to 'x' was cancelled: it was
stopped on purpose, so do not call it again unless you are asked to``. Any other
exception is a bug and fails the run. A timeout,
toolexec's or the SDK's own (``timeout_seconds``), is handled as the SDK handles its
own tools' timeouts: with ``tool.timeout_behavior = "raise_exception"`` the run fails
with the SDK's ``ToolTimeoutError``; otherwise the model is shown what
``tool.timeout_error_function(ctx, error)`` returns (toolexec sets one that words it
``[TOOL_TIMEOUT] Tool 'slow_report' timed out after 0.5s``; set your own, or None for
the SDK's default text).

(d) Strict schemas make every property required. The tool is strict only when that is
lossless: optional parameters are made nullable and a null sent for one is dropped
before the call (the tool's default applies; the idempotency key is that of a call
leaving it out), except where null is a value of its own (nullable, default not null):
there it is kept, and the model sends the default to mean it. A parameter with no
default to send, a nested optional property without one, or a schema
``ensure_strict_json_schema`` refuses gives a non-strict tool with the catalog's schema.

(e) Approval: a tool that requires approval (``@tool(requires_approval=True)``, or the
proxy's override) is a ``FunctionTool(needs_approval=True)``: the run stops with
``result.interruptions``; ``state = result.to_state()``, ``state.approve(item)`` or
``state.reject(item)``, then ``Runner.run(agent, state)`` sends each approved call once
and never a rejected one (the model reads the SDK's rejection text).

(f) Progress. The SDK has no event for a running tool's progress: its stream events
are model deltas, run items (a call, then its output) and agent changes, and its hooks
see a tool start and end only. Its tracing is the channel it has, so each report a
remote tool makes, in a traced run, is a ``toolexec.tool_progress`` custom span
(``done``, ``total``, ``message``, ``tool``, ``call_id``), a child of the call's
function span, which trace processors receive. The message is left out when the run
keeps sensitive data out of its traces (``RunConfig(trace_include_sensitive_data=False)``).
An untraced run asks for no progress.

(g) Cancellation. The SDK runs each tool call as a task of the run, and cancels it
when the run is cancelled: the cancel of the task awaiting ``Runner.run``, or a
streamed run's ``result.cancel()`` (``mode="immediate"``, the default; ``"after_turn"``
lets the turn's tool calls finish). The ``CancelledError`` reaches ``invoke``
untouched, so the caller abandons the call: a tool declared
``@tool(on_abandon="cancel")`` is stopped on its worker, one that leaves it (the
default) runs on.

Importing this module imports the SDK (the ``toolexec[openai-agents]`` extra).
"""

from __future__ import annotations

import copy
import inspect
import json
import uuid
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from jsonschema import Draft202012Validator

from agent_client.deadline import NOT_SET
from agent_client.errors import (
    RemoteToolError,
    ToolArgumentsInvalid,
    ToolCancelled,
    ToolTimeoutError,
)
from agent_client.frameworks import cancelled_text, carried_run_id, require
from agent_client.progress import ProgressCallback, ProgressEvent
from agent_client.runs import current_run_id

require("agents", extra="openai-agents", framework="openai-agents")

from agents import FunctionTool, RunContextWrapper, UserError
from agents.exceptions import ToolTimeoutError as SDKToolTimeoutError
from agents.strict_schema import ensure_strict_json_schema
from agents.tool import default_tool_timeout_error_message
from agents.tool_context import ToolContext
from agents.tracing import custom_span, get_current_span, get_current_trace
from agents.tracing.spans import NoOpSpan
from agents.tracing.traces import NoOpTrace

if TYPE_CHECKING:
    from agent_client.remote import RemoteTool

__all__ = ["TOOL_PROGRESS", "openai_agents_tool", "run_id_for", "strict_parameters"]

#: The name of the custom span each progress report of a traced run becomes.
TOOL_PROGRESS = "toolexec.tool_progress"


def openai_agents_tool(remote: RemoteTool) -> FunctionTool:
    """Build the ``agents.FunctionTool`` that runs ``remote`` on a worker."""
    strict, nulls_mean_default = strict_parameters(remote.parameters)

    async def on_invoke_tool(ctx: ToolContext[Any], raw_arguments: str) -> Any:
        return await _call(remote, tool, ctx, raw_arguments, nulls_mean_default)

    tool = FunctionTool(
        name=remote.name,
        description=remote.description,
        params_json_schema=strict if strict is not None else copy.deepcopy(remote.parameters),
        on_invoke_tool=on_invoke_tool,
        strict_json_schema=strict is not None,
        needs_approval=remote.requires_approval,
        timeout_error_function=_sdk_timeout_text,
    )
    return tool


async def _call(
    remote: RemoteTool,
    tool: FunctionTool,
    ctx: ToolContext[Any],
    raw: str,
    nulls_mean_default: frozenset[str],
) -> Any:
    try:
        arguments = json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        return (
            f"[INVALID_ARGUMENTS] arguments for tool {remote.name!r} are not JSON ({exc}); "
            "send one JSON object"
        )
    if isinstance(arguments, dict):
        arguments = {
            k: v for k, v in arguments.items() if v is not None or k not in nulls_mean_default
        }
    framework = NOT_SET if tool.timeout_seconds is None else tool.timeout_seconds
    try:
        result = await remote.invoke(
            arguments,
            run_id=run_id_for(ctx),
            framework_timeout=framework,
            on_progress=_progress_spans(remote.name, ctx),
        )
    except ToolArgumentsInvalid as exc:
        return f"[INVALID_ARGUMENTS] {exc}"
    except ToolTimeoutError as exc:
        return await _timed_out(tool, ctx, exc.timeout)
    except ToolCancelled as exc:
        return f"[TOOL_CANCELLED] {cancelled_text(exc)}"
    except RemoteToolError as exc:
        return f"[TOOL_ERROR] {exc}"
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)


async def _timed_out(tool: FunctionTool, ctx: ToolContext[Any], seconds: float) -> Any:
    """What toolexec's timeout of ``tool`` becomes, as the SDK treats its own timeouts."""
    error = SDKToolTimeoutError(tool_name=tool.name, timeout_seconds=seconds)
    if tool.timeout_behavior == "raise_exception":
        raise error
    formatter = tool.timeout_error_function
    if formatter is None:
        return default_tool_timeout_error_message(tool_name=tool.name, timeout_seconds=seconds)
    shown = formatter(ctx, error)
    return await shown if inspect.isawaitable(shown) else shown


def _progress_spans(tool: str, ctx: ToolContext[Any]) -> ProgressCallback | None:
    """The ``on_progress`` that records each report as a span of this call, or None untraced."""
    parent = get_current_span()
    if parent is None or isinstance(parent, NoOpSpan):
        return None
    sensitive = ctx.run_config is None or ctx.run_config.trace_include_sensitive_data

    def record(event: ProgressEvent) -> None:
        data: dict[str, Any] = {
            "tool": tool,
            "call_id": ctx.tool_call_id,
            "done": event.done,
            "total": event.total,
        }
        if sensitive:
            data["message"] = event.message
        span = custom_span(TOOL_PROGRESS, data, parent=parent)
        span.start()
        span.finish()

    return record


def _timeout_text(tool: str, seconds: float) -> str:
    return f"[TOOL_TIMEOUT] Tool {tool!r} timed out after {seconds:g}s"


def _sdk_timeout_text(ctx: RunContextWrapper[Any], error: Exception) -> str:
    """The SDK's ``timeout_error_function``: its own timeout, worded as toolexec's."""
    if isinstance(error, SDKToolTimeoutError):
        return _timeout_text(error.tool_name, error.timeout_seconds)
    return f"[TOOL_TIMEOUT] {error}"


# -- run id ---------------------------------------------------------------------------

#: Run ids of runs without a trace, by ``id()`` of the run's Usage object while it lives.
_usage_runs: dict[int, str] = {}


def run_id_for(ctx: RunContextWrapper[Any]) -> str | None:
    """The toolexec run of a tool call; None defers to the enclosing ``run_scope()``."""
    named = carried_run_id(ctx.context)
    if named is not None:
        return named
    if current_run_id() is not None:
        return None
    trace = get_current_trace()
    if trace is not None and not isinstance(trace, NoOpTrace):
        return trace.trace_id
    key = id(ctx.usage)
    if key not in _usage_runs:
        _usage_runs[key] = uuid.uuid4().hex
        weakref.finalize(ctx.usage, _usage_runs.pop, key, None)
    return _usage_runs[key]


# -- strict schema ----------------------------------------------------------------------


def strict_parameters(schema: dict[str, Any]) -> tuple[dict[str, Any] | None, frozenset[str]]:
    """The strict form of ``schema`` if lossless, and the parameters whose null means default.

    Returns:
        ``(None, frozenset())`` when the tool must stay non-strict.
    """
    if not _nested_optionals_have_defaults(schema, top=True):
        return None, frozenset()
    properties: dict[str, Any] = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    nullable = copy.deepcopy(schema)
    defaults_on_null: set[str] = set()
    for name, prop in properties.items():
        if name in required:
            continue
        if not _accepts_null(prop, schema):
            nullable["properties"][name] = _or_null(prop)
            defaults_on_null.add(name)
        elif "default" not in prop:
            return None, frozenset()  # "left out" and null would read the same
        elif prop["default"] is None:
            defaults_on_null.add(name)
    try:
        return ensure_strict_json_schema(nullable), frozenset(defaults_on_null)
    except (UserError, TypeError, ValueError, LookupError, AssertionError):
        return None, frozenset()


def _accepts_null(prop: Any, root: dict[str, Any]) -> bool:
    if not isinstance(prop, dict):
        return prop is True
    definitions = {k: root[k] for k in ("$defs", "definitions") if k in root}
    return bool(Draft202012Validator({**definitions, **prop}).is_valid(None))


def _or_null(prop: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {k: prop[k] for k in ("title", "description", "default") if k in prop}
    inner = {k: v for k, v in prop.items() if k not in meta}
    return {"anyOf": [inner, {"type": "null"}], **meta}


def _nested_optionals_have_defaults(node: dict[str, Any], *, top: bool) -> bool:
    """True if every optional property below the top level has a default the model can send."""
    properties = node.get("properties")
    if not top and isinstance(properties, dict):
        required = node.get("required") or ()
        for name, prop in properties.items():
            if name not in required and not (isinstance(prop, dict) and "default" in prop):
                return False
    return all(_nested_optionals_have_defaults(sub, top=False) for sub in _subschemas(node))


def _subschemas(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for key in ("properties", "$defs", "definitions"):
        if isinstance(mapping := node.get(key), dict):
            yield from (s for s in mapping.values() if isinstance(s, dict))
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if isinstance(listed := node.get(key), list):
            yield from (s for s in listed if isinstance(s, dict))
    for key in ("items", "additionalProperties", "not"):
        if isinstance(sub := node.get(key), dict):
            yield sub
