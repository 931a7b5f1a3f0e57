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
the model, so every :class:`RemoteToolError` is returned as text and the run goes on:
``[INVALID_ARGUMENTS] invalid arguments for tool 'book_flight': flight_id: ...`` (also
for arguments that are not a JSON object), ``[TOOL_TIMEOUT] Tool 'slow_report' timed
out after 0.5s`` (the SDK's own timeout is worded the same), ``[TOOL_ERROR] tool
'search' failed: ValueError: ...``. Any other exception is a bug and fails the run.

(d) Strict schemas make every property required. The tool is strict only when that is
lossless: optional parameters are made nullable and a null sent for one is dropped
before the call (the tool's default applies; the idempotency key is that of a call
leaving it out), except where null is a value of its own (nullable, default not null):
there it is kept, and the model sends the default to mean it. A parameter with no
default to send, a nested optional property without one, or a schema
``ensure_strict_json_schema`` refuses gives a non-strict tool with the catalog's schema.

Importing this module imports the SDK (the ``toolexec[openai-agents]`` extra).
"""

from __future__ import annotations

import copy
import json
import uuid
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from jsonschema import Draft202012Validator

from agent_client.deadline import NOT_SET
from agent_client.errors import RemoteToolError, ToolArgumentsInvalid, ToolTimeoutError
from agent_client.frameworks import carried_run_id, require
from agent_client.scope import current_run_id

require("agents", extra="openai-agents", framework="openai-agents")

from agents import FunctionTool, RunContextWrapper, UserError
from agents.exceptions import ToolTimeoutError as SDKToolTimeoutError
from agents.strict_schema import ensure_strict_json_schema
from agents.tool_context import ToolContext
from agents.tracing import get_current_trace
from agents.tracing.traces import NoOpTrace

if TYPE_CHECKING:
    from agent_client.remote import RemoteTool

__all__ = ["openai_agents_tool", "run_id_for", "strict_parameters"]


def openai_agents_tool(remote: RemoteTool) -> FunctionTool:
    """Build the ``agents.FunctionTool`` that runs ``remote`` on a worker."""
    strict, nulls_mean_default = strict_parameters(remote.parameters)

    async def on_invoke_tool(ctx: ToolContext[Any], raw_arguments: str) -> str:
        return await _call(remote, tool, ctx, raw_arguments, nulls_mean_default)

    tool = FunctionTool(
        name=remote.name,
        description=remote.description,
        params_json_schema=strict if strict is not None else copy.deepcopy(remote.parameters),
        on_invoke_tool=on_invoke_tool,
        strict_json_schema=strict is not None,
        timeout_error_function=_sdk_timeout_text,
    )
    return tool


async def _call(
    remote: RemoteTool,
    tool: FunctionTool,
    ctx: ToolContext[Any],
    raw: str,
    nulls_mean_default: frozenset[str],
) -> str:
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
        result = await remote.invoke(arguments, run_id=run_id_for(ctx), framework_timeout=framework)
    except ToolArgumentsInvalid as exc:
        return f"[INVALID_ARGUMENTS] {exc}"
    except ToolTimeoutError as exc:
        return _timeout_text(remote.name, exc.timeout)
    except RemoteToolError as exc:
        return f"[TOOL_ERROR] {exc}"
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)


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
