"""Run one call of a registered tool and turn what happened into a :class:`CallOutcome`.

Every rule here is unit-tested directly, without Celery or Redis: an expired call is
refused before anything runs, the worker validates the arguments with pydantic (it is
the authority), ``def`` and ``async def`` tools run under their hard limit
(:mod:`executor.limits`), and the return value or exception becomes JSON data
(:mod:`executor.outcomes` encodes it for the wire).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from typing import Any

import pydantic
import pydantic_core

from executor import cancel_state, observe
from executor.context import CallContext, _calling
from executor.limits import (
    HardTimeout,
    NotStarted,
    Starting,
    ToolExited,
    await_tool,
    run_bounded,
    shutting_down,
)
from executor.outcomes import too_deep_result
from executor.registry import ToolDefinition, get_tool
from executor.retries import Attempts
from executor.tracing import call_log_fields
from wire.clock import shared_now
from wire.models import CallOutcome, CallRequest, ErrorKind

__all__ = [
    "execute",
    "execute_async",
    "format_validation_error",
    "refuse_if_expired",
]

logger = logging.getLogger(__name__)

#: How a sync tool's hard timeout ends where its thread cannot be stopped (solo, threads).
_NOT_STOPPED = (
    "was abandoned: its thread cannot be stopped on this pool and runs on until the tool returns"
)


def _fields(request: CallRequest) -> dict[str, Any]:
    # The call's ids and tool as attributes of a log record (never arguments or results).
    return call_log_fields(request.call_id, request.run_id, request.tool)


def refuse_if_expired(
    request: CallRequest, *, worker: str = "", now: float | None = None
) -> CallOutcome | None:
    """The refusal of a call whose deadline has passed before it started, else None.

    The one deadline check on the worker: the task makes it before anything else, on
    every pool (Celery's own expiry check misses on the threads pool and for
    prefetched messages). ``now`` defaults to the clock the client set the deadline
    by (:func:`wire.clock.shared_now`), so a worker whose clock is off neither refuses
    live calls nor runs ones whose caller has left.
    """
    if request.deadline is None or (shared_now() if now is None else now) < request.deadline:
        return None
    logger.info(
        "call %s of %s expired before it started; not running it",
        request.call_id,
        request.tool,
        extra=_fields(request),
    )
    return CallOutcome.failure(
        request.call_id,
        ErrorKind.EXPIRED,
        "DeadlineExpired",
        f"the deadline of this call to {request.tool!r} passed before a worker started it",
        worker=worker,
    )


def execute(
    request: CallRequest,
    *,
    worker: str = "",
    definition: ToolDefinition | None = None,
    starting: Starting | None = None,
) -> CallOutcome:
    """Run ``request`` and return its outcome; never raises for anything the tool does.

    The caller has checked the deadline (:func:`refuse_if_expired`); ``starting``, when
    given, is asked once more as the tool is about to start, and its refusal (a deadline
    passed, a caller gone) is the outcome instead. A tool that retries runs again after a
    pause while its policy and the deadline allow (:mod:`executor.retries`).
    """
    run = _prepare(request, worker=worker, definition=definition)
    if isinstance(run, CallOutcome):
        return run
    refusal = None if starting is None else starting()
    if refusal is not None:
        return refusal
    attempts = _attempts(request, run.definition)
    while True:
        _count_attempt(request, attempts)
        try:
            with _calling(run.context):
                value = run_bounded(run.definition, run.kwargs)
        except _ENDINGS as exc:
            if not isinstance(exc, Exception) and shutting_down():
                raise  # billiard's own SIGTERM handler: this pool process is shutting down
            pause = _pause_after(attempts, exc)
            # The pause ends early if the call is cancelled (answered as cancelled by _ended).
            if pause is None or cancel_state.event_for(request.call_id).wait(pause):
                return attempts.stamp(_ended(request, run.definition, exc, worker=worker))
            continue
        return _returned(request, value, worker=worker)


async def execute_async(
    request: CallRequest,
    *,
    worker: str = "",
    definition: ToolDefinition | None = None,
    starting: Starting | None = None,
) -> CallOutcome:
    """:func:`execute` on the running event loop (the asyncio pool, :mod:`executor.pools`).

    An ``async def`` tool runs as a coroutine on this loop, at once; a ``def`` tool runs in
    the loop's default executor (the pool's bounded thread pool), where it may wait for a
    thread: the thread that takes it asks ``starting`` first, and a refusal is the
    outcome instead (the tool never starts). At the hard limit an async
    tool is cancelled; a sync tool's thread cannot be stopped, so its caller is answered
    and the thread runs on until the tool returns. Cancelling the caller's task (the pool
    shutting down cold) cancels the tool and propagates.
    """
    run = _prepare(request, worker=worker, definition=definition)
    if isinstance(run, CallOutcome):
        return run
    attempts = _attempts(request, run.definition)
    pause: float | None = None
    while True:
        try:
            if pause is not None:  # in the try: the call's cancel may end the pause
                await _paused(request.call_id, pause)
            _count_attempt(request, attempts)
            with _calling(run.context):
                value = await await_tool(
                    run.definition, run.kwargs, starting=starting if pause is None else None
                )
        except NotStarted as refused:
            return refused.outcome
        except _ENDINGS as exc:
            current = asyncio.current_task()
            if (
                isinstance(exc, asyncio.CancelledError)
                and current is not None
                and current.cancelling()
                and cancel_state.requested(request.call_id)
            ):
                current.uncancel()  # the call's cancel (executor.cancel_state), not the pool's
            elif (
                isinstance(exc, asyncio.CancelledError)
                and current is not None
                and current.cancelling()
            ):
                raise  # the pool cancels this call
            pause = _pause_after(attempts, exc)
            if pause is None:
                return attempts.stamp(_ended(request, run.definition, exc, worker=worker))
            continue
        return _returned(request, value, worker=worker)


#: What a tool's run may end with, each answered as an outcome (:func:`_ended`): any
#: other BaseException (``GeneratorExit``, say) is not the tool's to answer.
_ENDINGS = (Exception, SystemExit, KeyboardInterrupt, asyncio.CancelledError)


def _attempts(request: CallRequest, definition: ToolDefinition) -> Attempts:
    """The attempts of ``request``; none after the first once the call is cancelled."""
    return Attempts(
        definition.retry,
        call=request,
        hard_timeout=definition.spec.hard_timeout,
        cancelled=functools.partial(cancel_state.requested, request.call_id),
    )


def _count_attempt(request: CallRequest, attempts: Attempts) -> None:
    """Start an attempt, and tell :mod:`executor.observe`."""
    observe.attempt(request, attempts.start())


def _pause_after(attempts: Attempts, exc: BaseException) -> float | None:
    """The pause before the next attempt, or None: only what the tool raised is retried,
    never its hard limit or its coroutine's ``SystemExit`` (nor a cancel, not an Exception)."""
    if not isinstance(exc, Exception) or isinstance(exc, HardTimeout | ToolExited):
        return None
    return attempts.pause_after(exc)


async def _paused(call_id: str, seconds: float) -> None:
    """Pause between two attempts; the call's cancel (:mod:`executor.cancel_state`) ends it."""
    sleep = asyncio.ensure_future(asyncio.sleep(seconds))
    cancel_state.bind_task(call_id, sleep, asyncio.get_running_loop())
    await sleep


def _ended(
    request: CallRequest, definition: ToolDefinition, exc: BaseException, *, worker: str
) -> CallOutcome:
    """The outcome of a run that raised ``exc`` (one of :data:`_ENDINGS`)."""
    if cancel_state.requested(request.call_id):  # however the tool ended after its cancel
        return cancel_state.cancelled_outcome(request, worker=worker)
    if isinstance(exc, HardTimeout):
        return _hard_timeout(
            request, definition.spec.hard_timeout, stopped=exc.stopped, worker=worker, how=exc.how
        )
    if isinstance(exc, ToolExited):
        return _escaped(request, exc.exc, worker=worker)
    if isinstance(exc, Exception):  # what the tool raised is its outcome
        return _raised(request, exc, worker=worker)
    return _escaped(request, exc, worker=worker)


@dataclass(frozen=True, slots=True)
class _Run:
    """A call about to run: its tool, the validated arguments, and the call's context."""

    definition: ToolDefinition
    kwargs: dict[str, Any]
    context: CallContext


def _prepare(
    request: CallRequest, *, worker: str, definition: ToolDefinition | None
) -> _Run | CallOutcome:
    """The call's :class:`_Run`, or the outcome refusing it (no such tool, invalid arguments)."""
    call_id = request.call_id
    definition = definition or get_tool(request.tool)
    if definition is None:
        return CallOutcome.failure(
            call_id,
            ErrorKind.NOT_FOUND,
            "ToolNotFound",
            f"no tool named {request.tool!r} is registered on worker {worker or '?'}",
            worker=worker,
        )
    try:
        validated = definition.model.model_validate(request.arguments)
    except pydantic.ValidationError as exc:
        return CallOutcome.failure(
            call_id,
            ErrorKind.INVALID_ARGUMENTS,
            "ValidationError",
            format_validation_error(request.tool, exc),
            worker=worker,
        )
    kwargs = {name: getattr(validated, name) for name in type(validated).model_fields}
    context = CallContext(
        call_id=call_id,
        run_id=request.run_id,
        tool=request.tool,
        idempotency_key=request.idempotency_key,
        deadline=request.deadline,
        cancelled=cancel_state.event_for(call_id),
    )
    if cancel_state.requested(call_id):  # cancelled between its admission and now: it never starts
        return cancel_state.cancelled_outcome(
            request,
            worker=worker,
            why=f"the call to {request.tool!r} was cancelled before it started",
        )
    return _Run(definition=definition, kwargs=kwargs, context=context)


def _hard_timeout(
    request: CallRequest, hard_timeout: float | None, *, stopped: bool, worker: str, how: str = ""
) -> CallOutcome:
    logger.warning(
        "call %s of %s passed its hard limit of %ss",
        request.call_id,
        request.tool,
        hard_timeout,
        extra=_fields(request),
    )
    return CallOutcome.failure(
        request.call_id,
        ErrorKind.HARD_TIMEOUT,
        "ToolHardTimeout",
        f"tool {request.tool!r} ran past its hard limit of {hard_timeout or 0:g}s and "
        + ("was stopped" if stopped else how or _NOT_STOPPED),
        worker=worker,
    )


def _raised(request: CallRequest, exc: Exception, *, worker: str) -> CallOutcome:
    logger.info(
        "call %s of %s raised %s",
        request.call_id,
        request.tool,
        type(exc).__name__,
        extra=_fields(request),
    )
    logger.debug("call %s traceback", request.call_id, exc_info=exc, extra=_fields(request))
    return CallOutcome.failure(
        request.call_id, ErrorKind.EXECUTION, type(exc).__qualname__, str(exc), worker=worker
    )


def _escaped(request: CallRequest, exc: BaseException, *, worker: str) -> CallOutcome:
    # A tool cannot end its worker process (nor cancel its own run): it failed.
    logger.warning(
        "call %s of %s raised %s; answered as its error",
        request.call_id,
        request.tool,
        type(exc).__name__,
        extra=_fields(request),
    )
    return CallOutcome.failure(
        request.call_id,
        ErrorKind.EXECUTION,
        type(exc).__qualname__,
        _exit_message(request.tool, exc),
        worker=worker,
    )


def _returned(request: CallRequest, value: Any, *, worker: str) -> CallOutcome:
    call_id = request.call_id
    if cancel_state.requested(call_id):  # it returned, but only after its cancel
        return cancel_state.cancelled_outcome(request, worker=worker)
    try:
        # bytes become UTF-8 text (pydantic's rule); bytes that are not UTF-8 are refused.
        result = pydantic_core.to_jsonable_python(value)
    except UnicodeDecodeError:
        return CallOutcome.failure(
            call_id,
            ErrorKind.EXECUTION,
            "UnserializableResult",
            f"tool {request.tool!r} returned bytes that are not UTF-8 text, which cannot be sent "
            "as JSON; return str, or base64-encode binary data",
            worker=worker,
        )
    except ValueError as exc:  # PydanticSerializationError, circular references
        if "recursion" in str(exc).lower():
            return too_deep_result(request.tool, call_id, worker=worker)
        return CallOutcome.failure(
            call_id,
            ErrorKind.EXECUTION,
            "UnserializableResult",
            f"tool {request.tool!r} returned a {type(value).__qualname__}, which cannot be sent as "
            "JSON; return JSON types, pydantic models, dataclasses or datetimes",
            worker=worker,
        )
    return CallOutcome.success(call_id, result, worker=worker)


def _exit_message(tool: str, exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return (
            f"tool {tool!r} called sys.exit({exc.code!r}) (SystemExit); the worker process was not "
            "stopped"
        )
    return f"tool {tool!r} raised {type(exc).__name__}{f': {exc}' if str(exc) else ''}"


def format_validation_error(tool: str, exc: pydantic.ValidationError) -> str:
    """A field-naming message for the model: ``limit: Input should be ...; query: ...``.

    Lone surrogates in a field's name are escaped (``\\ud800``): the message goes back
    as JSON. pydantic reports a name that is not valid Unicode with no location, the
    name itself as the input; the message names it as the field.
    """
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(p) for p in error["loc"])
        if not where and error["type"] == "string_unicode" and isinstance(error.get("input"), str):
            parts.append(
                f"{_printable(error['input'])}: a field name that is not valid Unicode (a lone "
                "surrogate)"
            )
            continue
        parts.append(f"{_printable(where) or '(arguments)'}: {error['msg']}")
    return "; ".join(parts)


def _printable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
