"""A remote tool's progress, as its caller sees it.

A tool on a worker calls ``executor.report_progress(done, total, message)``; its
caller receives each report as a :class:`ProgressEvent`, in order, before the outcome:

* ``await tool.invoke(args, on_progress=callback)`` calls ``callback(event)`` on the
  caller's event loop; a callback that returns an awaitable (an ``async def``) is
  awaited, one event after the other. ``invoke`` returns (or raises) only after every
  event has been handled.
* ``tool.invoke_sync(args, on_progress=callback)`` calls ``callback(event)`` on this
  process's progress thread (one for all calls, so keep it quick), and returns only
  after every event has been handled.
* ``async for event in tool.stream(**args)`` yields :class:`ProgressEvent`\\ s, then one
  :class:`ToolResult` carrying the result; a failed call raises its
  :class:`~agent_client.errors.RemoteToolError` after the progress it reported. Leaving
  the loop early cancels the call (the caller stops waiting; the worker runs on).

Nothing reaches a callback after the call has returned, raised or timed out: a report
that arrives for a caller that gave up is dropped. A callback that raises is logged
and the call goes on. The worker sends at most one report per 100 ms per call, always
the latest and the last one before the outcome, so a callback may miss intermediate
values, never the final one. Only the caller that sent a call gets its progress: a
caller that joined an idempotent call already running gets its outcome only.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import queue
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from wire.formats import parse_progress

__all__ = ["ProgressCallback", "ProgressEvent", "ProgressSink", "ToolResult", "stream_call"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    """One progress report of a running remote tool.

    Attributes:
        done: Work done so far, in the tool's unit.
        total: The work there is in all, when the tool knows it.
        message: The tool's text for people, if any.
    """

    done: float
    total: float | None = None
    message: str | None = None

    @property
    def fraction(self) -> float | None:
        """``done / total`` between 0 and 1, or None without a total."""
        if self.total is None:
            return None
        return min(1.0, max(0.0, self.done / self.total))


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The last item of :meth:`RemoteTool.stream <agent_client.RemoteTool.stream>`: the result.

    Attributes:
        result: What the tool returned, as JSON data.
    """

    result: Any


#: Receives each event; may return an awaitable when the call was made with ``await``.
ProgressCallback = Callable[[ProgressEvent], object]


class ProgressSink:
    """Hands one call's progress frames from the reply thread to its caller's callback.

    Made by the caller (:meth:`for_loop` or :meth:`for_thread`), given to the reply
    router with the call, and closed (:meth:`aclose` or :meth:`close`) once the call
    has returned or raised: closing waits for the events already received, and drops
    any later one.
    """

    def __init__(self, callback: ProgressCallback, loop: asyncio.AbstractEventLoop | None) -> None:
        self._callback = callback
        self._loop = loop
        self._closed = False
        self._tail: asyncio.Future[None] | None = None
        # The last report passed on, per attempt: a frame read again is dropped.
        self._last: tuple[str, int] = ("", 0)

    @classmethod
    def for_loop(cls, callback: ProgressCallback) -> ProgressSink:
        """A sink whose callback runs on the running event loop."""
        return cls(callback, asyncio.get_running_loop())

    @classmethod
    def for_thread(cls, callback: ProgressCallback) -> ProgressSink:
        """A sink whose callback runs on this process's progress thread."""
        return cls(callback, None)

    def deliver(self, body: bytes, call_id: str = "") -> None:
        """Take the body of a progress frame of ``call_id`` (from the reply thread);
        never raises."""
        if self._closed:
            return
        try:
            seq, done, total, message = parse_progress(body)
        except ValueError as exc:
            logger.debug("dropped a malformed progress report: %s", exc)
            return
        if self._last[0] == call_id and seq <= self._last[1]:
            return
        self._last = (call_id, seq)
        event = ProgressEvent(done, total, message)
        if self._loop is None:
            _callbacks().put(self, event)
            return
        try:
            self._loop.call_soon_threadsafe(self._on_loop, event)
        except RuntimeError:  # the caller's loop is closed: nobody waits
            self._closed = True

    def _on_loop(self, event: ProgressEvent) -> None:
        if self._closed:
            return
        if self._tail is not None and not self._tail.done():
            # An awaitable callback is still handling an earlier event: queue behind it.
            self._tail = asyncio.ensure_future(self._after(self._tail, event))
            return
        self._run(event)

    async def _after(self, previous: asyncio.Future[None], event: ProgressEvent) -> None:
        # Taken before the sink closed, so handled even if it closes meanwhile.
        await asyncio.wait({previous})
        result = self._call(event)
        if inspect.isawaitable(result):
            await self._guard(result)

    def _run(self, event: ProgressEvent) -> None:
        result = self._call(event)
        if inspect.isawaitable(result):
            self._tail = asyncio.ensure_future(self._guard(result))

    def _call(self, event: ProgressEvent) -> object:
        try:
            return self._callback(event)
        except Exception as exc:  # noqa: BLE001 - the caller's callback must not end the call
            _callback_failed(exc)
            return None

    @staticmethod
    async def _guard(result: Awaitable[object]) -> None:
        try:
            await result
        except Exception as exc:  # noqa: BLE001 - the caller's callback must not end the call
            _callback_failed(exc)

    async def aclose(self) -> None:
        """Wait until the events received so far are handled; take no more (the caller's loop)."""
        # The reply thread hands a call's progress to the loop before its outcome, so
        # every report that came before the outcome has been passed to the callback.
        self._closed = True
        tail = self._tail
        if tail is not None:
            await asyncio.wait({tail})

    def close(self, timeout: float | None = None) -> None:
        """Wait until the events received so far are handled; take no more (a sync caller)."""
        if self._loop is not None:
            self._closed = True
            return
        done = threading.Event()
        _callbacks().put(self, done)
        done.wait(timeout)
        self._closed = True

    def then(self, action: Callable[[], None]) -> None:
        """Take no more events, and run ``action`` on the progress thread once the events
        received so far are handled (a submitted call's end: ``agent_client.handles``)."""
        _callbacks().put(self, action)

    def _handle(self, item: ProgressEvent | threading.Event | Callable[[], None]) -> None:
        # On the progress thread.
        if isinstance(item, threading.Event):
            self._closed = True
            item.set()
        elif not isinstance(item, ProgressEvent):
            self._closed = True
            item()
        elif not self._closed:
            self._call(item)


def _callback_failed(exc: Exception) -> None:
    logger.warning("a progress callback raised %s; the call goes on", type(exc).__name__)
    logger.debug("progress callback traceback", exc_info=exc)


class _CallbackThread:
    """This process's thread that runs the progress callbacks of sync callers, in order."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._queue: queue.SimpleQueue[
            tuple[ProgressSink, ProgressEvent | threading.Event | Callable[[], None]]
        ] = queue.SimpleQueue()
        thread = threading.Thread(target=self._run, name="toolexec-progress-callbacks", daemon=True)
        thread.start()

    def put(
        self, sink: ProgressSink, item: ProgressEvent | threading.Event | Callable[[], None]
    ) -> None:
        self._queue.put((sink, item))

    def _run(self) -> None:
        while True:
            sink, item = self._queue.get()
            sink._handle(item)


_lock = threading.Lock()
_thread: _CallbackThread | None = None


def _callbacks() -> _CallbackThread:
    global _thread
    current = _thread
    if current is None or current.pid != os.getpid():
        with _lock:
            if _thread is None or _thread.pid != os.getpid():
                _thread = _CallbackThread()
            current = _thread
    return current


async def stream_call(
    invoke: Callable[..., Awaitable[Any]], arguments: dict[str, Any], **options: Any
) -> AsyncIterator[ProgressEvent | ToolResult]:
    """Run ``invoke(arguments, on_progress=..., **options)``; yield its progress, then its result.

    Raises:
        RemoteToolError: The call failed; raised after the progress it reported.
    """
    events: asyncio.Queue[ProgressEvent | None] = asyncio.Queue()
    call = asyncio.ensure_future(invoke(arguments, on_progress=events.put_nowait, **options))
    # invoke() returns only after its last event was handed over, so None comes last.
    call.add_done_callback(lambda _: events.put_nowait(None))
    try:
        while (event := await events.get()) is not None:
            yield event
        yield ToolResult(call.result())
    finally:
        if not call.done():
            call.cancel()
            await asyncio.wait({call})
        elif not call.cancelled():
            call.exception()  # retrieved: a failure already raised is not reported again
