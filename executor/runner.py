"""Run one call of a registered tool and turn what happened into a :class:`CallOutcome`.

Pure of Celery and Redis, so every rule here is unit-tested directly: an expired call
is refused before anything runs, the worker validates the arguments with pydantic (it is
the authority), ``def`` and ``async def`` tools run under their hard limit, and the
return value or exception becomes JSON data.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import weakref
from asyncio import AbstractEventLoop, Task
from collections.abc import Callable, Coroutine
from contextvars import copy_context
from typing import Any

import pydantic
import pydantic_core
from billiard.common import terminate_handler_fired

from executor.context import CallContext, _calling
from executor.identity import in_pool_child
from executor.registry import ToolDefinition, get_tool
from executor.tracing import call_log_fields
from wire.clock import shared_now
from wire.models import CallOutcome, CallRequest, ErrorKind

__all__ = ["encode_outcome", "execute", "execute_async", "format_validation_error", "refuse_if_expired", "runaways"]

logger = logging.getLogger(__name__)


class _HardTimeout(Exception):
    def __init__(self, stopped: bool = True, *, how: str = "") -> None:
        super().__init__()
        self.stopped = stopped
        self.how = how  # why it was not stopped, when not the thread's reason


class _Exited(Exception):
    """A tool coroutine's ``SystemExit`` or ``KeyboardInterrupt``, carried past asyncio.

    A task that raises either makes its event loop raise it too, out of
    ``run_until_complete`` or the loop's ``run_forever`` (the asyncio pool's loop thread),
    and leaves the task's exception unretrieved. Raised as this inside the coroutine,
    it is an ordinary task failure, answered like the sync tool's own (:func:`_escaped`).
    """

    def __init__(self, exc: SystemExit | KeyboardInterrupt) -> None:
        super().__init__()
        self.exc = exc


async def _contained(coro: Coroutine[Any, Any, Any]) -> Any:
    """Await a tool's coroutine; its ``SystemExit`` or ``KeyboardInterrupt`` as :class:`_Exited`."""
    try:
        return await coro
    except (SystemExit, KeyboardInterrupt) as exc:
        raise _Exited(exc) from None


#: How a sync tool's hard timeout ends where its thread cannot be stopped (solo, threads).
_NOT_STOPPED = "was abandoned: its thread cannot be stopped on this pool and runs on until the tool returns"
#: How an async tool's ends on the asyncio pool when it ignores its cancellation: the
#: loop it runs on is every call's, so it cannot be abandoned with it.
_IGNORED_CANCEL = "was cancelled, ignored it, and runs on in the worker's event loop until it returns"


def _fields(request: CallRequest) -> dict[str, Any]:
    # The call's ids and tool as attributes of a log record (never arguments or results).
    return call_log_fields(request.call_id, request.run_id, request.tool)


def refuse_if_expired(request: CallRequest, *, worker: str = "", now: float | None = None) -> CallOutcome | None:
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
        "call %s of %s expired before it started; not running it", request.call_id, request.tool,
        extra=_fields(request),
    )  # fmt: skip
    return CallOutcome.failure(
        request.call_id, ErrorKind.EXPIRED, "DeadlineExpired",
        f"the deadline of this call to {request.tool!r} passed before a worker started it",
        worker=worker,
    )


def execute(request: CallRequest, *, worker: str = "", definition: ToolDefinition | None = None) -> CallOutcome:
    """Run ``request`` and return its outcome; never raises for anything the tool does.

    The caller has checked the deadline (:func:`refuse_if_expired`).
    """
    prepared = _prepare(request, worker=worker, definition=definition)
    if isinstance(prepared, CallOutcome):
        return prepared
    definition, kwargs, context = prepared
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
        return _hard_timeout(request, hard_timeout, stopped=definition.is_async or in_pool_child(), worker=worker)
    except _Exited as exited:
        return _escaped(request, exited.exc, worker=worker)
    except Exception as exc:  # noqa: BLE001 - what the tool raised is its outcome
        return _raised(request, exc, worker=worker)
    except (SystemExit, KeyboardInterrupt, asyncio.CancelledError) as exc:
        if terminate_handler_fired():
            raise  # billiard's own SIGTERM handler: this pool process is shutting down
        return _escaped(request, exc, worker=worker)
    return _returned(request, value, worker=worker)


async def execute_async(
    request: CallRequest, *, worker: str = "", definition: ToolDefinition | None = None
) -> CallOutcome:
    """:func:`execute` on the running event loop (the asyncio pool, :mod:`executor.pools`).

    An ``async def`` tool runs as a coroutine on this loop; a ``def`` tool runs in the
    loop's default executor (the pool's bounded thread pool). At the hard limit an async
    tool is cancelled; a sync tool's thread cannot be stopped, so its caller is answered
    and the thread runs on until the tool returns. Cancelling the caller's task (the pool
    shutting down cold) cancels the tool and propagates.
    """
    prepared = _prepare(request, worker=worker, definition=definition)
    if isinstance(prepared, CallOutcome):
        return prepared
    definition, kwargs, context = prepared
    hard_timeout = definition.spec.hard_timeout
    try:
        with _calling(context):
            value = await _await_tool(definition, kwargs, hard_timeout)
    except _HardTimeout as timeout:
        return _hard_timeout(request, hard_timeout, stopped=timeout.stopped, worker=worker, how=timeout.how)
    except _Exited as exited:
        return _escaped(request, exited.exc, worker=worker)
    except Exception as exc:  # noqa: BLE001 - what the tool raised is its outcome
        return _raised(request, exc, worker=worker)
    except (SystemExit, KeyboardInterrupt, asyncio.CancelledError) as exc:
        current = asyncio.current_task()
        if isinstance(exc, asyncio.CancelledError) and current is not None and current.cancelling():
            raise  # the pool cancels this call
        return _escaped(request, exc, worker=worker)
    return _returned(request, value, worker=worker)


def _prepare(
    request: CallRequest, *, worker: str, definition: ToolDefinition | None
) -> tuple[ToolDefinition, dict[str, Any], CallContext] | CallOutcome:
    """The tool, its validated arguments and the call's context; or the outcome refusing it."""
    call_id = request.call_id
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
    return definition, kwargs, context


def _hard_timeout(
    request: CallRequest, hard_timeout: float | None, *, stopped: bool, worker: str, how: str = ""
) -> CallOutcome:
    logger.warning(
        "call %s of %s passed its hard limit of %ss", request.call_id, request.tool, hard_timeout,
        extra=_fields(request),
    )  # fmt: skip
    return CallOutcome.failure(
        request.call_id, ErrorKind.HARD_TIMEOUT, "ToolHardTimeout",
        f"tool {request.tool!r} ran past its hard limit of {hard_timeout or 0:g}s and "
        + ("was stopped" if stopped else how or _NOT_STOPPED),
        worker=worker,
    )


def _raised(request: CallRequest, exc: Exception, *, worker: str) -> CallOutcome:
    logger.info(
        "call %s of %s raised %s", request.call_id, request.tool, type(exc).__name__, extra=_fields(request)
    )
    logger.debug("call %s traceback", request.call_id, exc_info=exc, extra=_fields(request))
    return CallOutcome.failure(
        request.call_id, ErrorKind.EXECUTION, type(exc).__qualname__, str(exc), worker=worker
    )


def _escaped(request: CallRequest, exc: BaseException, *, worker: str) -> CallOutcome:
    # A tool cannot end its worker process (nor cancel its own run): it failed.
    logger.warning(
        "call %s of %s raised %s; answered as its error", request.call_id, request.tool, type(exc).__name__,
        extra=_fields(request),
    )  # fmt: skip
    return CallOutcome.failure(
        request.call_id, ErrorKind.EXECUTION, type(exc).__qualname__, _exit_message(request.tool, exc), worker=worker
    )


def _returned(request: CallRequest, value: Any, *, worker: str) -> CallOutcome:
    call_id = request.call_id
    try:
        # bytes become UTF-8 text (pydantic's rule); bytes that are not UTF-8 are refused.
        result = pydantic_core.to_jsonable_python(value)
    except UnicodeDecodeError:
        return CallOutcome.failure(
            call_id, ErrorKind.EXECUTION, "UnserializableResult",
            f"tool {request.tool!r} returned bytes that are not UTF-8 text, which cannot be sent as "
            "JSON; return str, or base64-encode binary data",
            worker=worker,
        )
    except ValueError:  # PydanticSerializationError, circular references
        return CallOutcome.failure(
            call_id, ErrorKind.EXECUTION, "UnserializableResult",
            f"tool {request.tool!r} returned a {type(value).__qualname__}, which cannot be sent as "
            "JSON; return JSON types, pydantic models, dataclasses or datetimes",
            worker=worker,
        )
    return CallOutcome.success(call_id, result, worker=worker)


def _exit_message(tool: str, exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"tool {tool!r} called sys.exit({exc.code!r}) (SystemExit); the worker process was not stopped"
    return f"tool {tool!r} raised {type(exc).__name__}{f': {exc}' if str(exc) else ''}"


def encode_outcome(outcome: CallOutcome, *, tool: str, max_bytes: int) -> str:
    """The outcome as JSON, replaced by an error outcome when it exceeds ``max_bytes``
    or cannot be JSON (a string that is not valid Unicode: a lone surrogate)."""
    try:
        encoded = outcome.model_dump_json()
    except pydantic_core.PydanticSerializationError:
        return CallOutcome.failure(
            outcome.call_id, ErrorKind.EXECUTION, "UnserializableResult",
            f"tool {tool!r} returned text that is not valid Unicode (a lone surrogate), which "
            "cannot be sent as JSON",
            worker=outcome.worker,
        ).model_dump_json()
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
    """A field-naming message for the model: ``limit: Input should be ...; query: ...``.

    Lone surrogates in a field's name are escaped (``\\ud800``): the message goes back
    as JSON. pydantic reports a name that is not valid Unicode with no location, the
    name itself as the input; the message names it as the field.
    """
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(p) for p in error["loc"])
        if not where and error["type"] == "string_unicode" and isinstance(error.get("input"), str):
            parts.append(f"{_printable(error['input'])}: a field name that is not valid Unicode (a lone surrogate)")
            continue
        parts.append(f"{_printable(where) or '(arguments)'}: {error['msg']}")
    return "; ".join(parts)


def _printable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


_loops = threading.local()


class _LoopOwner:
    """Held in its thread's locals only, beside the loop: its finalizer closes the loop when
    the thread ends, when the process exits, or when the thread takes a fresh loop after
    abandoning this one. No loop is left to the garbage collector unclosed."""


def _thread_loop() -> asyncio.AbstractEventLoop:
    # One loop per worker thread, kept: a fresh loop per call costs more than the call.
    loop: asyncio.AbstractEventLoop | None = getattr(_loops, "loop", None)
    if loop is None or loop.is_closed():
        loop = asyncio.new_event_loop()
        _loops.loop, _loops.owner = loop, _LoopOwner()
        weakref.finalize(_loops.owner, _close_unless_running, loop)
    return loop


def _close_unless_running(loop: AbstractEventLoop) -> None:
    if not loop.is_running():  # at exit, a daemon thread may still be in a call
        loop.close()


#: Seconds an async tool has to end after its hard limit cancelled it.
_CANCEL_GRACE = 0.5

_runaway_lock = threading.Lock()
#: Tool threads left running past their hard limit.
_runaway_threads: list[threading.Thread] = []
#: Async tools that ignored their cancellation, each with the loop it waits on, which
#: never runs again. Kept referenced: collecting a pending task logs an error.
_abandoned: list[tuple[AbstractEventLoop, Task[Any]]] = []


def runaways() -> int:
    """How many tool runs this process abandoned at their hard limit and could not stop.

    A sync tool's thread counts until it returns; an async tool that ignored its
    cancellation counts for good (its loop never runs again, so it never resumes).
    """
    with _runaway_lock:
        _runaway_threads[:] = [t for t in _runaway_threads if t.is_alive()]
        return len(_runaway_threads) + len(_abandoned)


def _run_async(func: Callable[..., Any], kwargs: dict[str, Any], hard_timeout: float | None) -> Any:
    loop = _thread_loop()
    task = loop.create_task(_contained(func(**kwargs)))
    if hard_timeout is None:
        return loop.run_until_complete(task)
    # At the hard limit the task is cancelled; a tool that has not ended
    # _CANCEL_GRACE later (it ignores cancellation) is abandoned with its loop.
    timers: list[asyncio.TimerHandle] = []

    def expire() -> None:
        task.cancel()
        timers.append(loop.call_later(_CANCEL_GRACE, loop.stop))

    timers.append(loop.call_later(hard_timeout, expire))
    try:
        return loop.run_until_complete(task)
    except asyncio.CancelledError:
        if len(timers) > 1:  # our cancellation, not the tool's own
            raise _HardTimeout from None
        raise
    except RuntimeError:
        if task.done():  # the tool's own RuntimeError
            raise
        # "Event loop stopped before Future completed": the tool ignored cancellation.
        _loops.loop = None
        with _runaway_lock:
            _abandoned.append((loop, task))
        raise _HardTimeout from None
    finally:
        for timer in timers:
            timer.cancel()


def _run_sync_bounded(func: Callable[..., Any], kwargs: dict[str, Any], hard_timeout: float) -> Any:
    # A thread cannot be killed. The run is abandoned and counted (runaways()); a
    # prefork child then leaves once the outcome is delivered (executor.exits), while
    # on solo and threads the thread runs on until the tool returns.
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
        with _runaway_lock:
            _runaway_threads.append(thread)
        raise _HardTimeout
    if "error" in box:
        raise box["error"]
    return box.get("value")


async def _await_tool(definition: ToolDefinition, kwargs: dict[str, Any], hard_timeout: float | None) -> Any:
    """Await the tool on the running loop, under its hard limit."""
    if definition.is_async and hard_timeout is None:
        return await definition.func(**kwargs)  # no task of its own: nothing to time
    if definition.is_async:
        run: asyncio.Future[Any] = asyncio.ensure_future(_contained(definition.func(**kwargs)))
    else:
        # The tool's thread sees this call's context (current_call()).
        call = functools.partial(copy_context().run, definition.func, **kwargs)
        run = asyncio.get_running_loop().run_in_executor(None, call)
    if hard_timeout is None:
        return await run
    try:
        done, _ = await asyncio.wait({run}, timeout=hard_timeout)
        if not done:
            run.cancel()  # a thread runs on; a coroutine gets _CANCEL_GRACE to end
            if definition.is_async:
                await asyncio.wait({run}, timeout=_CANCEL_GRACE)
            if definition.is_async and not run.done():
                raise _HardTimeout(stopped=False, how=_IGNORED_CANCEL)
            raise _HardTimeout(stopped=definition.is_async)
    except asyncio.CancelledError:
        run.cancel()
        raise
    return run.result()
