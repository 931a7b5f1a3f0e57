"""Run one call of a registered tool and turn what happened into a :class:`CallOutcome`.

Pure of Celery and Redis, so every rule here is unit-tested directly: the deadline is
checked before anything runs, the worker validates the arguments with pydantic (it is
the authority), ``def`` and ``async def`` tools run under their hard limit, and the
return value or exception becomes JSON data.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from contextvars import copy_context
from typing import Any

import pydantic
import pydantic_core

from executor.context import CallContext, _calling
from executor.protocol import CallOutcome, CallRequest, ErrorKind
from executor.registry import ToolDefinition, get_tool

__all__ = ["encode_outcome", "execute", "format_validation_error"]

logger = logging.getLogger(__name__)


class _HardTimeout(Exception):
    pass


def execute(request: CallRequest, *, worker: str = "", definition: ToolDefinition | None = None) -> CallOutcome:
    """Run ``request`` and return its outcome; never raises for anything the tool does."""
    call_id = request.call_id
    if request.deadline is not None and time.time() >= request.deadline:
        logger.info("call %s of %s expired before it started; not running it", call_id, request.tool)
        return CallOutcome.failure(
            call_id, ErrorKind.EXPIRED, "DeadlineExpired",
            f"the deadline of this call to {request.tool!r} passed before a worker started it",
            worker=worker,
        )
    definition = definition or get_tool(request.tool)
    if definition is None:
        return CallOutcome.failure(
            call_id, ErrorKind.NOT_FOUND, "ToolNotFound",
            f"no tool named {request.tool!r} is registered on worker {worker or '?'}",
            worker=worker,
        )
    try:
        validated = definition.model.model_validate(request.arguments)
    except pydantic.ValidationError as exc:
        return CallOutcome.failure(
            call_id, ErrorKind.INVALID_ARGUMENTS, "ValidationError",
            format_validation_error(request.tool, exc), worker=worker,
        )
    kwargs = {name: getattr(validated, name) for name in type(validated).model_fields}
    context = CallContext(
        call_id=call_id,
        run_id=request.run_id,
        tool=request.tool,
        idempotency_key=request.idempotency_key,
        deadline=request.deadline,
    )
    hard_timeout = definition.spec.hard_timeout
    try:
        with _calling(context):
            if definition.is_async:
                value = _run_async(definition.func, kwargs, hard_timeout)
            elif hard_timeout is not None:
                value = _run_sync_bounded(definition.func, kwargs, hard_timeout)
            else:
                value = definition.func(**kwargs)
    except _HardTimeout:
        logger.warning("call %s of %s passed its hard limit of %ss", call_id, request.tool, hard_timeout)
        return CallOutcome.failure(
            call_id, ErrorKind.HARD_TIMEOUT, "ToolHardTimeout",
            f"tool {request.tool!r} ran past its hard limit of {hard_timeout:g}s and was stopped",
            worker=worker,
        )
    except Exception as exc:
        logger.info("call %s of %s raised %s", call_id, request.tool, type(exc).__name__)
        logger.debug("call %s traceback", call_id, exc_info=True)
        return CallOutcome.failure(
            call_id, ErrorKind.EXECUTION, type(exc).__qualname__, str(exc), worker=worker
        )
    try:
        result = pydantic_core.to_jsonable_python(value)
    except ValueError:  # PydanticSerializationError, circular references, undecodable bytes
        return CallOutcome.failure(
            call_id, ErrorKind.EXECUTION, "UnserializableResult",
            f"tool {request.tool!r} returned a {type(value).__qualname__}, which cannot be sent as "
            "JSON; return JSON types, pydantic models, dataclasses or datetimes",
            worker=worker,
        )
    return CallOutcome.success(call_id, result, worker=worker)


def encode_outcome(outcome: CallOutcome, *, tool: str, max_bytes: int) -> str:
    """The outcome as JSON, replaced by an error outcome when it exceeds ``max_bytes``."""
    encoded = outcome.model_dump_json()
    size = len(encoded.encode())
    if size <= max_bytes:
        return encoded
    too_big = CallOutcome.failure(
        outcome.call_id, ErrorKind.EXECUTION, "ResultTooLarge",
        f"tool {tool!r} returned {size} bytes of JSON; the limit is {max_bytes} "
        "(TOOLEXEC_MAX_RESULT_BYTES)",
        worker=outcome.worker,
    )
    return too_big.model_dump_json()


def format_validation_error(tool: str, exc: pydantic.ValidationError) -> str:
    """A field-naming message for the model: ``limit: Input should be ...; query: ...``."""
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(p) for p in error["loc"]) or "(arguments)"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


_loops = threading.local()


def _thread_loop() -> asyncio.AbstractEventLoop:
    # One loop per worker thread, kept: a fresh loop per call costs more than the call.
    loop: asyncio.AbstractEventLoop | None = getattr(_loops, "loop", None)
    if loop is None or loop.is_closed():
        loop = asyncio.new_event_loop()
        _loops.loop = loop
    return loop


def _run_async(func: Callable[..., Any], kwargs: dict[str, Any], hard_timeout: float | None) -> Any:
    async def bounded() -> Any:
        # A TimeoutError the tool raises itself is its own failure, not our hard limit.
        scope = asyncio.timeout(hard_timeout)
        try:
            async with scope:
                return await func(**kwargs)
        except TimeoutError:
            if scope.expired():
                raise _HardTimeout from None
            raise

    return _thread_loop().run_until_complete(bounded())


def _run_sync_bounded(func: Callable[..., Any], kwargs: dict[str, Any], hard_timeout: float) -> Any:
    # A thread cannot be killed: on the prefork pool Celery's own time limit (sent a
    # little above ours) ends the child; on solo and threads the run is abandoned.
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = func(**kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    context = copy_context()
    thread = threading.Thread(target=context.run, args=(target,), daemon=True, name="toolexec-tool")
    thread.start()
    thread.join(hard_timeout)
    if thread.is_alive():
        raise _HardTimeout
    if "error" in box:
        raise box["error"]
    return box.get("value")
