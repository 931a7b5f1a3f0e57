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

**Outcomes first.** A call's admission may wait on Redis (a begin or a copy's start
tried again while Redis refuses writes, for up to its patience), and a lane runs the
steps it took one after another. So the outcome of a call that has run is never queued
behind them: its delivery goes to a lane of its own (:meth:`Offload.deliver`,
:meth:`Offload.deliver_batched`), and an outcome ready is sent as soon as Redis takes it,
however many calls wait to begin.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

__all__ = ["DELIVERY_THREADS", "IO_THREADS", "IOLanes", "Offload"]

T = TypeVar("T")
Item = TypeVar("Item")  # an item of a batched step

#: Threads that run the short blocking steps of async task bodies (Redis round trips).
IO_THREADS = 2
#: Threads that deliver outcomes, apart from the others (see "Outcomes first").
DELIVERY_THREADS = 1


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

    def deliver(self, func: Callable[[], T], /) -> Awaitable[T]:
        """As calling this, on the delivery lane: for a step that sends an outcome."""
        ...

    def deliver_batched(
        self, func: Callable[[list[Item]], list[T | BaseException]], item: Item, /
    ) -> Awaitable[T]:
        """As :meth:`batched`, on the delivery lane: for steps that send outcomes."""
        ...

    def alone(self) -> bool:
        """Whether the pool runs no call but the asker's: an outcome ready now has no
        other to share a round trip with, so the thread that has it may send it itself.

        Safe to ask from any thread; the answer may be stale by the time it is used,
        which costs a batch or a hop, never an outcome.
        """
        ...


class IOLanes:
    """The pool's :class:`Offload`: lanes for the blocking steps, and lanes of their own
    for the deliveries of outcomes (see the module: how they batch, and why apart).

    Args:
        threads: How many threads take the steps.
        delivery_threads: How many threads take the deliveries.
        calls: How many calls the pool runs now (:meth:`alone` asks it); none by default.
    """

    def __init__(
        self,
        threads: int,
        *,
        delivery_threads: int = DELIVERY_THREADS,
        calls: Callable[[], int] = lambda: 0,
    ) -> None:
        self._steps = _Lanes(threads, name="toolexec-io")
        self._deliveries = _Lanes(delivery_threads, name="toolexec-deliver")
        self._calls = calls

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the threads; they settle their futures on ``loop``."""
        self._steps.start(loop)
        self._deliveries.start(loop)

    def __call__(self, func: Callable[[], T], /) -> asyncio.Future[T]:
        """Queue ``func``; a future of the running loop gets its result."""
        return self._steps(func)

    def batched(
        self, func: Callable[[list[Item]], list[T | BaseException]], item: Item, /
    ) -> asyncio.Future[T]:
        """Queue ``item`` for ``func``; a future of the running loop gets its result."""
        return self._steps.batched(func, item)

    def deliver(self, func: Callable[[], T], /) -> asyncio.Future[T]:
        """Queue ``func``, which delivers an outcome, on the delivery lanes."""
        return self._deliveries(func)

    def deliver_batched(
        self, func: Callable[[list[Item]], list[T | BaseException]], item: Item, /
    ) -> asyncio.Future[T]:
        """Queue ``item`` for ``func``, which delivers outcomes, on the delivery lanes."""
        return self._deliveries.batched(func, item)

    def alone(self) -> bool:
        """Whether the pool runs at most one call (the asker's): see :meth:`Offload.alone`."""
        return self._calls() <= 1

    def stop(self) -> None:
        """Let each thread finish the steps queued before, then end it (the steps first:
        a step may still end in a delivery); wait for them."""
        self._steps.stop()
        self._deliveries.stop()


class _Lanes:
    """Threads that run blocking steps for the loop, handing results back in batches.

    Args:
        threads: How many threads (lanes) take steps.
        name: The threads' name prefix.
    """

    def __init__(self, threads: int, *, name: str) -> None:
        self._steps: queue.SimpleQueue[_Step | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
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
