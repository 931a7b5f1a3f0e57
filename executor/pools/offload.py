"""The asyncio pool's I/O threads: blocking steps run off the loop, results back in batches.

A task body on the asyncio pool (:mod:`executor.pools.asyncio_pool`) never waits on a
socket on the loop: it hands each short blocking step (a Redis round trip) to
:class:`IOLanes`, the pool's :class:`Offload`, and awaits a future of the loop.

**Batching.** Calls arrive together and end together, so the threads hand work to each
other in batches. Unlike ``loop.run_in_executor``, which wakes the loop (a write to its
self-pipe) once per step, a lane takes every step queued meanwhile, runs them, then
settles all their futures with one wake-up of the loop; and steps queued with
:meth:`Offload.batched` for the same function run as one call of it (the outcome pushes
of many plain calls then share one Redis pipeline).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

__all__ = ["IO_THREADS", "IOLanes", "Offload"]

T = TypeVar("T")
Item = TypeVar("Item")  # an item of a batched step

#: Threads that run the short blocking steps of async task bodies (Redis round trips).
IO_THREADS = 2


class Offload(Protocol):
    """Runs a short blocking step (a Redis round trip) off the event loop and awaits it."""

    def __call__(self, func: Callable[[], T], /) -> Awaitable[T]: ...

    def batched(
        self, func: Callable[[list[Item]], list[T | BaseException]], item: Item, /
    ) -> Awaitable[T]:
        """Run ``func`` on ``item`` and every other item queued for ``func`` meanwhile.

        ``func`` gets the items in the order they were queued and returns one result per
        item, an exception standing for that item's failure; this call awaits the result
        of ``item``. Steps that finish at the same moment thus share one round trip.
        """
        ...


class IOLanes:
    """Threads that run blocking steps for the loop, handing results back in batches.

    This is the pool's :class:`Offload` (see the module for how it batches).

    Args:
        threads: How many threads (lanes) take steps.
    """

    def __init__(self, threads: int) -> None:
        self._steps: queue.SimpleQueue[_Step | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._run, name=f"toolexec-io-{i}", daemon=True)
            for i in range(threads)
        ]
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the threads; they settle their futures on ``loop``."""
        self._loop = loop
        for thread in self._threads:
            thread.start()

    def __call__(self, func: Callable[[], T], /) -> asyncio.Future[T]:
        """Queue ``func``; a future of the running loop gets its result."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._steps.put(_Step(func, future))
        return future

    def batched(
        self, func: Callable[[list[Item]], list[T | BaseException]], item: Item, /
    ) -> asyncio.Future[T]:
        """Queue ``item`` for ``func``; a future of the running loop gets its result."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._steps.put(_Step(func, future, item, batched=True))
        return future

    def stop(self) -> None:
        """Let each thread finish the steps queued before, then end it; wait for them."""
        for _ in self._threads:
            self._steps.put(None)
        for thread in self._threads:
            if thread.is_alive():
                thread.join()

    def _run(self) -> None:
        assert self._loop is not None
        while True:
            steps: list[_Step] = []
            step = self._steps.get()
            while step is not None:
                steps.append(step)
                try:
                    step = self._steps.get_nowait()
                except queue.Empty:
                    break
            done = _run_steps(steps)
            if done:
                try:
                    self._loop.call_soon_threadsafe(_settle, done)
                except RuntimeError:  # the loop is closed: nobody awaits these any more
                    return
            if step is None:
                return


@dataclass(slots=True)
class _Step:
    """A step queued for the lanes: ``func()``, or ``func([item, ...])`` when batched."""

    func: Callable[..., Any]
    future: asyncio.Future[Any]
    item: Any = None
    batched: bool = False


_Settled = list[tuple[asyncio.Future[Any], Any, BaseException | None]]


def _run_steps(steps: list[_Step]) -> _Settled:
    """Run queued steps in order, each batched function once for all its items."""
    done: _Settled = []
    batches: dict[Callable[..., Any], list[_Step]] = {}
    for step in steps:
        if step.batched:
            batches.setdefault(step.func, []).append(step)
            continue
        try:
            done.append((step.future, step.func(), None))
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            done.append((step.future, None, exc))
    for func, batch in batches.items():
        try:
            results = list(func([step.item for step in batch]))
            if len(results) != len(batch):
                raise RuntimeError(
                    f"{func!r} returned {len(results)} results for {len(batch)} items"
                )
        except BaseException as exc:  # noqa: BLE001 - handed to every awaiting coroutine
            results = [exc] * len(batch)
        for step, result in zip(batch, results, strict=True):
            if isinstance(result, BaseException):
                done.append((step.future, None, result))
            else:
                done.append((step.future, result, None))
    return done


def _settle(done: _Settled) -> None:
    for future, value, exc in done:
        if future.cancelled():
            continue
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(value)
