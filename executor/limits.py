"""A tool's hard limit (``@tool(hard_timeout=...)``): run it bounded, and count what ran on.

:func:`run_bounded` runs a tool in the calling thread (the solo, threads and prefork
pools): an ``async def`` tool on this thread's own event loop, cancelled at its limit;
a ``def`` tool in a thread of its own, abandoned at its limit, since a thread cannot be
killed (the asyncio pool runs a ``def`` tool so, in one of its tool threads).
:func:`await_tool` runs it on the running event loop: an ``async def`` tool as a task,
cancelled at its limit; a ``def`` tool in the loop's default executor, its caller
answered at the limit while the thread runs on. Either
raises :class:`HardTimeout` at the limit, and :class:`ToolExited` for a coroutine's own
``SystemExit`` or ``KeyboardInterrupt``; :mod:`executor.runner` turns each into an
outcome.

A run that could not be stopped is counted (:func:`runaways`). A prefork child then
leaves once its outcome is delivered (:func:`retire_if_runaway`), and billiard starts a
fresh one; on the solo and threads pools the thread runs on until the tool returns.

This is the one module outside :mod:`executor.seams` and :mod:`executor.pools` that
imports Celery's libraries: :func:`shutting_down` asks billiard whether its own SIGTERM
handler fired, which a tool's ``SystemExit`` must not be mistaken for.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import weakref
from asyncio import AbstractEventLoop, Task
from collections.abc import Callable, Coroutine
from contextvars import copy_context
from typing import Any, Protocol

from billiard.common import terminate_handler_fired

from executor import cancel_state
from executor.context import current_call
from executor.errors import ProcessRetired
from executor.registry import ToolDefinition
from executor.worker import in_pool_child
from wire.models import CallOutcome

__all__ = [
    "HardTimeout",
    "NotStarted",
    "Starting",
    "ToolExited",
    "await_tool",
    "retire_if_runaway",
    "run_bounded",
    "runaways",
    "shutting_down",
]


class HardTimeout(Exception):
    """A tool ran past its hard limit: ``stopped`` says whether it was stopped."""

    def __init__(self, stopped: bool = True, *, how: str = "") -> None:
        super().__init__()
        self.stopped = stopped
        self.how = how  # why it was not stopped, when not the thread's reason


class ToolExited(Exception):
    """A tool coroutine's ``SystemExit`` or ``KeyboardInterrupt``, carried past asyncio.

    A task that raises either makes its event loop raise it too, out of
    ``run_until_complete`` or the loop's ``run_forever`` (the asyncio pool's loop thread),
    and leaves the task's exception unretrieved. Raised as this inside the coroutine,
    it is an ordinary task failure, answered like the sync tool's own
    (:mod:`executor.runner`).
    """

    def __init__(self, exc: SystemExit | KeyboardInterrupt) -> None:
        super().__init__()
        self.exc = exc


async def _contained(coro: Coroutine[Any, Any, Any]) -> Any:
    """Await a tool's coroutine; its ``SystemExit`` or ``KeyboardInterrupt`` as
    :class:`ToolExited`."""
    try:
        return await coro
    except (SystemExit, KeyboardInterrupt) as exc:
        raise ToolExited(exc) from None


#: How an async tool's hard timeout ends on the asyncio pool when it ignores its
#: cancellation: the loop it runs on is every call's, so it cannot be abandoned with it.
_IGNORED_CANCEL = (
    "was cancelled, ignored it, and runs on in the worker's event loop until it returns"
)


class Starting(Protocol):
    """Asked as a call's tool is about to start: the outcome refusing it, or None."""

    def __call__(self) -> CallOutcome | None: ...


class NotStarted(Exception):
    """A call refused as its tool was about to start (:class:`Starting`); it never ran."""

    def __init__(self, outcome: CallOutcome) -> None:
        super().__init__(outcome.error.type if outcome.error is not None else "refused")
        self.outcome = outcome


def _gated(starting: Starting | None, func: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """Run ``func`` in this thread unless ``starting`` refuses the call."""
    refusal = None if starting is None else starting()
    if refusal is not None:
        raise NotStarted(refusal)
    return func(**kwargs)


def shutting_down() -> bool:
    """Whether billiard's own SIGTERM handler fired: this pool process is shutting down."""
    return bool(terminate_handler_fired())


def run_bounded(definition: ToolDefinition, kwargs: dict[str, Any]) -> Any:
    """Run the tool in this thread under its hard limit; its value.

    Raises:
        HardTimeout: The tool ran past its hard limit.
        ToolExited: An ``async def`` tool raised ``SystemExit`` or ``KeyboardInterrupt``.
    """
    hard_timeout = definition.spec.hard_timeout
    if definition.is_async:
        return _run_async(definition.func, kwargs, hard_timeout)
    if hard_timeout is not None:
        return _run_sync_bounded(definition.func, kwargs, hard_timeout)
    return definition.func(**kwargs)


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


def retire_if_runaway() -> None:
    """In a prefork child with a tool thread still running past its hard limit, leave.

    Call it after the outcome is delivered. On the solo and threads pools the process
    is the worker itself, so it stays, and the thread runs on until the tool returns.

    Raises:
        ProcessRetired: This is a prefork pool child with a runaway tool thread.
    """
    count = runaways()
    if count and in_pool_child():
        raise ProcessRetired(f"leaving: {count} tool thread(s) ran past their hard limit")


def _run_async(func: Callable[..., Any], kwargs: dict[str, Any], hard_timeout: float | None) -> Any:
    loop = _thread_loop()
    task = loop.create_task(_contained(func(**kwargs)))
    _cancellable(task, loop)
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
            raise HardTimeout from None
        raise
    except RuntimeError:
        if task.done():  # the tool's own RuntimeError
            raise
        # "Event loop stopped before Future completed": the tool ignored cancellation.
        _loops.loop = None
        with _runaway_lock:
            _abandoned.append((loop, task))
        raise HardTimeout from None
    finally:
        for timer in timers:
            timer.cancel()


def _cancellable(task: asyncio.Future[Any], loop: AbstractEventLoop) -> None:
    # The call's cancel (executor.cancel_state) cancels the tool's task.
    try:
        call_id = current_call().call_id
    except LookupError:
        return  # not a worker's run of a call
    cancel_state.bind_task(call_id, task, loop)


def _run_sync_bounded(func: Callable[..., Any], kwargs: dict[str, Any], hard_timeout: float) -> Any:
    # A thread cannot be killed. The run is abandoned and counted (runaways()); a
    # prefork child then leaves once the outcome is delivered (retire_if_runaway),
    # while on solo and threads the thread runs on until the tool returns.
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
        raise HardTimeout(stopped=in_pool_child())  # a prefork child leaves, and the thread with it
    if "error" in box:
        raise box["error"]
    return box.get("value")


async def await_tool(
    definition: ToolDefinition, kwargs: dict[str, Any], *, starting: Starting | None = None
) -> Any:
    """Await the tool on the running loop, under its hard limit; its value.

    A ``def`` tool waits for a thread of the loop's executor; the thread asks
    ``starting`` (when given) before it starts the tool.

    Raises:
        HardTimeout: The tool ran past its hard limit.
        ToolExited: An ``async def`` tool raised ``SystemExit`` or ``KeyboardInterrupt``.
        NotStarted: ``starting`` refused the call: the tool never started.
    """
    hard_timeout = definition.spec.hard_timeout
    if definition.is_async and hard_timeout is None:
        current = asyncio.current_task()
        if current is not None:
            _cancellable(current, asyncio.get_running_loop())  # its cancel cancels this task
        return await definition.func(**kwargs)  # no task of its own: nothing to time
    if definition.is_async:
        run: asyncio.Future[Any] = asyncio.ensure_future(_contained(definition.func(**kwargs)))
        _cancellable(run, asyncio.get_running_loop())
    else:
        # The tool's thread sees this call's context (current_call()).
        call = functools.partial(copy_context().run, _gated, starting, definition.func, kwargs)
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
                raise HardTimeout(stopped=False, how=_IGNORED_CANCEL)
            raise HardTimeout(stopped=definition.is_async)
    except asyncio.CancelledError:
        run.cancel()
        raise
    return run.result()
