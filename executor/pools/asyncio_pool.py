"""A Celery worker pool that runs async task bodies as coroutines on one event loop.

Celery has no asyncio pool; this one is built on its supported pool interface
(:class:`celery.concurrency.base.BasePool`) and chosen through Celery's own mechanisms::

    CELERY_CUSTOM_WORKER_POOL=executor.pools.asyncio_pool:AsyncioPool \\
        celery -A executor worker -P custom -c 1000

or ``worker_pool = "executor.pools.asyncio_pool:AsyncioPool"`` in the app's config, which
toolexec's app sets from ``TOOLEXEC_WORKER_POOL=asyncio``::

    TOOLEXEC_WORKER_POOL=asyncio celery -A executor worker -c 1000

Design
======

**Threads.** The worker stays one process. Its main thread runs Celery's consumer as on
every pool; the pool adds one thread running an asyncio event loop, a bounded
:class:`~concurrent.futures.ThreadPoolExecutor` for synchronous work
(:func:`tool_threads`: ``min(32, N + 4)`` threads, made only when used; it is also the
loop's default executor, so ``asyncio.to_thread`` in a tool uses it), and
:data:`~executor.pools.offload.IO_THREADS` threads for the short blocking steps of a
task body (its Redis round trips, :mod:`executor.pools.offload`). A thousand awaiting
tools therefore cost no thread each.

**Who reads the queues.** With a Redis broker the loop reads them itself
(:mod:`executor.pools.reads`, ``TOOLEXEC_LOOP_READS``): each read takes at most the free
slots and is handed, on the loop, to the channel of Celery's task consumer, which delivers
its messages through Celery's strategy and request as it delivers its own reads; the
request then reaches :meth:`AsyncioPool.on_apply` on the loop thread and starts at once.
Otherwise (RabbitMQ, kombu's ack emulation, ``TOOLEXEC_LOOP_READS=false``) Celery's
consumer reads in the worker's main thread, as on every other pool.

**How a call reaches the loop.** Celery's strategy calls ``pool.apply_async(trace,
args=(task name, task id, request dict, body, content type, content encoding),
accept_callback=..., callback=..., ...)`` (``Request.execute_using_pool``). The trace
function is synchronous, so this pool does not call it for a task that has an async
body (:class:`~executor.pools.trace.AsyncTask`, toolexec's tasks): it starts a coroutine
for the request, at once when the loop read it, else through the loop's *inbox* (below),
where the coroutine

1. waits for one of N slots (``-c N``; prefetch is N too, ``worker_prefetch_multiplier=1``,
   so N calls are in flight at once. Read by the loop, a read takes no more than the
   free slots, so no call waits here. Read by Celery's consumer, prefetch counts
   unacknowledged messages: at-least-once calls, acknowledged when they end, are never
   more than N in the worker; at-most-once calls are acknowledged as they start, so up
   to N more wait here for a slot, held by this worker as its heartbeat records them,
   pid 0);
2. calls ``accept_callback(pid, monotonic())``: Celery's ``Request.on_accepted`` marks
   the request active (``worker_state.active_requests``, which the heartbeat reads; the
   holder pid is the worker's own), acknowledges an early-ack task and sends the
   ``task-started`` event (in an I/O thread when it records the holder in Redis first:
   an at-most-once call on RabbitMQ, :mod:`executor.claims`);
3. runs the body as Celery's trace would (:class:`~executor.pools.trace.AsyncTrace`:
   decode, signals, ``await task.run_async(request, offload, ...)``, failures handled
   by Celery's own ``TraceInfo``);
4. calls ``callback(result)``: Celery's ``Request.on_success`` (or ``on_failure``) marks
   the request done, acknowledges a late-ack task and sends ``task-succeeded``.

Every other task takes a slot too, then runs Celery's own trace in the bounded
executor, as on the threads pool.

**Batching.** Calls arrive together and end together, so the threads hand work to each
other in batches: while requests keep arriving and more than one call is on the loop,
the loop takes them from its inbox every :data:`INBOX_POLL` seconds instead of being
woken for each (a wake-up is a system call after which Celery's consumer waits for the
GIL). With one call at a time there is nothing to gather: a look that leaves only one
call on the loop, or a loop whose calls have all ended, stops polling, and the next
request wakes the loop at once (polling on, each sequential call waited for the next
look, up to :data:`INBOX_POLL`: a round trip faster than that took about that long).
The I/O threads (:class:`~executor.pools.offload.IOLanes`) run every step queued
meanwhile and settle them with one wake-up of the loop, and steps offloaded with
``Offload.batched`` (the outcome pushes of plain calls) go to Redis in one pipeline.

**A synchronous tool** runs in one of the executor's threads with the rest of its call
(:func:`executor.task.run_call_async`): the thread runs the tool and, while the pool runs
no other call, delivers its outcome itself, as a prefork child does. Handing the outcome
back to the loop and on to a delivery thread cost a call made one at a time two more
thread wake-ups, which put the pool's round trip of a ``def`` tool behind prefork's.
A plain call that ends beside others goes back to the loop and shares the delivery
lane's pipeline; a keyed call's outcome always leaves from its thread. A call cancelled
while it waits for a thread is answered as the thread takes it, without starting.

**Callbacks** run on the loop thread, as the threads pool runs them on its threads;
Celery hands the acknowledgements they make to its consumer's event loop (the main
thread, ``Consumer.call_soon_ack``), except while the loop reads the queues: then an
acknowledgement only marks the message done in the channel's memory, and is made where
it is asked (:class:`executor.seams.consumer.Consumer`).

**The GIL.** The pool lowers the interpreter's thread switch interval to
:data:`SWITCH_INTERVAL` (0.5 ms): with Python's 5 ms, each socket call of Celery's
consumer or of an I/O thread waited for the busy loop thread to let go of the GIL, and
1,000 calls took about 1.5 times as long (measured on a loaded 2-core machine).

**Shutdown.** A warm shutdown (``SIGTERM``) lets every accepted coroutine finish and
deliver, then stops the loop. From Celery's ``close()``, the first step of a shutdown,
the pool accepts nothing more, and its reader reads nothing more: a request still waiting
for a slot is dropped unaccepted, so its message is unacknowledged and kombu puts it back
on its queue when the consumer closes. A cold shutdown cancels the coroutines.

**Limits.** A coroutine that blocks (never awaits) stalls every call on the loop; a
synchronous tool past its hard limit cannot be stopped: its caller is answered and the
tool's thread runs on (a thread of its own, :func:`executor.limits.run_bounded`, so the
executor's thread is free again; such threads are not bounded by the executor's size:
:func:`executor.limits.runaways` counts them). A synchronous tool that retries holds its executor
thread through the pauses between its attempts. ``revoke(terminate=True)`` is not
supported, as on the threads pool.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from celery import current_app
from celery.concurrency.base import BasePool, apply_target
from celery.concurrency.thread import ApplyResult
from celery.utils.nodenames import gethostname
from kombu.serialization import prepare_accept_content

from executor.claims import waits_for_hold
from executor.pools.offload import DELIVERY_THREADS, IO_THREADS, IOLanes, Offload
from executor.pools.reads import LoopReader, ReadChannel
from executor.pools.trace import AsyncTask, AsyncTrace

# AsyncTask, Offload and IO_THREADS live in the modules of their concepts; they stay
# importable from here, where the pool's users found them first.
__all__ = ["IO_THREADS", "AsyncTask", "AsyncioPool", "Offload", "tool_threads"]

logger = logging.getLogger(__name__)

#: The interpreter's thread switch interval while the pool runs, in seconds (Python's
#: default is 0.005). A thread back from a socket call waits up to this long for the
#: GIL while another thread runs Python code; at 5 ms, every Redis round trip of the I/O
#: threads and of Celery's consumer queued behind the busy loop.
SWITCH_INTERVAL = 0.0005

#: Seconds between two looks of the loop for new requests while they keep arriving (a
#: request that arrives after a look found none wakes the loop at once). With 1,000
#: calls arriving at once, waking the loop for each took Celery's consumer about a
#: third longer per message (and 2 ms beat 1 ms and 5 ms on a 2-core machine).
INBOX_POLL = 0.002

#: Seconds a cold shutdown waits for the cancelled coroutines to end.
COLD_GRACE = 5.0

#: Most threads of the bounded executor, whatever the concurrency.
MAX_TOOL_THREADS = 32

#: Threads of the bounded executor beyond the concurrency: a sync tool past its hard
#: limit keeps its thread until it returns, and the next sync calls need one.
SPARE_TOOL_THREADS = 4


@dataclass(frozen=True, slots=True)
class _Job:
    """A request handed to the loop: Celery's trace and its arguments and callbacks."""

    task: AsyncTask | None  # None: a task without an async body, traced in a thread
    target: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any] | None
    callback: Callable[..., Any] | None
    accept_callback: Callable[..., Any] | None


def tool_threads(concurrency: int) -> int:
    """Threads of the pool's bounded executor: ``min(32, concurrency + 4)``."""
    return min(MAX_TOOL_THREADS, max(1, concurrency) + SPARE_TOOL_THREADS)


class AsyncioPool(BasePool):  # type: ignore[misc]
    """Up to ``limit`` coroutines at once on one event loop, in the worker process itself."""

    #: Celery may not stop it from inside a signal handler (it joins threads).
    signal_safe = False
    #: Its calls share the worker's own process: no one call can be ended on its own
    #: (executor.seams.request's cancel); a cold stop cancels every coroutine at once.
    runs_in_process = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limit: int = max(1, int(self.limit or 1))
        initargs: Sequence[Any] = self.options.get("initargs") or ()
        # The worker's node name, which Celery's trace puts in each request's hostname.
        self._hostname: str = (initargs[1] if len(initargs) > 1 else None) or gethostname()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tools = ThreadPoolExecutor(
            tool_threads(self.limit), thread_name_prefix="toolexec-tool"
        )
        self._io = IOLanes(IO_THREADS, calls=self._on_loop)
        self._trace: AsyncTrace | None = None  # made when the pool starts
        self._slots = asyncio.Semaphore(self.limit)
        self._waiting: set[asyncio.Task[None]] = set()  # handed over, not accepted yet
        # Requests the consumer handed over, not yet on the loop: one wake-up of the loop
        # takes all that arrived meanwhile (a wake-up writes to the loop's self-pipe).
        self._inbox: collections.deque[_Job] = collections.deque()
        self._wake_pending = False
        self._poll: asyncio.TimerHandle | None = None  # the next look while polling
        self._closing = False  # from Celery's close(): accept nothing more
        self._accepted: set[asyncio.Task[None]] = set()  # running on the loop
        self._reader: LoopReader | None = None  # reads the queues on the loop, once asked
        self._loop_thread: int | None = None  # the loop thread's ident

    # -- Celery's pool interface --------------------------------------------------------

    def on_start(self) -> None:
        """Start the event loop in its own thread."""
        app = self.app or current_app._get_current_object()
        accept = prepare_accept_content(app.conf.accept_content)  # type: ignore[no-untyped-call]
        self._trace = AsyncTrace(hostname=self._hostname, accept=accept, offload=self._io)
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
        loop = asyncio.new_event_loop()
        loop.set_default_executor(self._tools)
        self._loop = loop
        self._thread = threading.Thread(
            target=self._run_loop, args=(loop,), name="toolexec-asyncio", daemon=True
        )
        self._thread.start()
        self._io.start(loop)

    def on_apply(
        self,
        target: Callable[..., Any],
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        callback: Callable[..., Any] | None = None,
        accept_callback: Callable[..., Any] | None = None,
        **_: Any,
    ) -> ApplyResult | None:
        """Run an async task body on the loop; anything else through Celery's trace in a thread.

        Either way the request takes one of the ``limit`` slots first.
        """
        loop = self._loop
        if loop is None:  # not started: as the threads pool would
            return ApplyResult(
                self._tools.submit(apply_target, target, args, kwargs, callback, accept_callback)
            )
        job = _Job(
            task=self._async_task(args),
            target=target,
            args=tuple(args or ()),
            kwargs=kwargs,
            callback=callback,
            accept_callback=accept_callback,
        )
        if threading.get_ident() == self._loop_thread:
            # Read by the loop itself (executor.pools.reads): it starts now, no wake-up.
            self._start_job(loop, job)
            return None
        self._inbox.append(job)
        if not self._wake_pending:
            self._wake_pending = True
            loop.call_soon_threadsafe(self._take_inbox)
        return None

    def on_close(self) -> None:
        """The worker is shutting down: accept no more requests (before its consumer stops)."""
        self._closing = True

    def read_queues(
        self, channel: ReadChannel, *, url: str, master: str | None
    ) -> Callable[[], None]:
        """Read ``channel``'s queues on the loop and hand it each read
        (:mod:`executor.pools.reads`); returns what detaches the reader from it. Called by
        the consumer's bootstep as it starts, once the pool runs."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("the asyncio pool reads its queues only once it runs")
        if self._reader is None:
            self._reader = LoopReader(url, master=master, room=self._room)
            self._reader.start(loop)
        reader = self._reader
        reader.attach(channel)
        return reader.detach

    def wake_reader(self) -> None:
        """Tell the reader to look again (the queues it reads changed); from any thread."""
        if self._reader is not None:
            self._reader.wake()

    def _room(self) -> int:
        """How many calls a read may take now: the free slots, none once closing."""
        return 0 if self._closing else self.limit - self._on_loop()

    def on_stop(self) -> None:
        """Warm shutdown: let accepted coroutines finish, drop the waiting, stop the loop."""
        self._shutdown(cancel=False)
        super().on_stop()

    def on_terminate(self) -> None:
        """Cold shutdown: cancel every coroutine and stop the loop."""
        self._shutdown(cancel=True)

    def terminate_job(self, pid: int, signal: int | None = None) -> None:
        """Not supported: every call shares the worker's one process and loop."""
        raise NotImplementedError(
            "the asyncio pool cannot terminate one job (revoke(terminate=True))"
        )

    def _get_info(self) -> dict[str, Any]:
        info: dict[str, Any] = super()._get_info()
        info.update(
            {
                "max-concurrency": self.limit,
                "running": len(self._accepted),
                "waiting": len(self._waiting),
                "tool-threads": len(self._tools._threads),
                "io-threads": IO_THREADS,
                "delivery-threads": DELIVERY_THREADS,
                # Messages the loop read itself (executor.pools.reads), and in how many reads.
                "loop-reads": {
                    "messages": self._reader.messages if self._reader else 0,
                    "reads": self._reader.reads if self._reader else 0,
                },
            }
        )
        return info

    # -- the loop thread ------------------------------------------------------------------

    def _run_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop_thread = threading.get_ident()
        asyncio.set_event_loop(loop)
        loop.run_forever()

    def _async_task(self, args: Sequence[Any] | None) -> AsyncTask | None:
        if not args or not isinstance(args[0], str):
            return None
        task = (self.app or current_app).tasks.get(args[0])
        return task if callable(getattr(task, "run_async", None)) else None

    def _take_inbox(self) -> None:
        # While requests keep arriving, the loop looks for more every INBOX_POLL seconds
        # and the consumer does not wake it (_wake_pending stays set): a wake-up is a
        # write to the loop's self-pipe, a system call after which Celery's consumer waits
        # for the GIL. When a look finds nothing, or leaves a single call on the loop
        # (one call at a time: nothing to gather, and the next one would wait for the
        # look), the consumer wakes the loop again.
        self._poll = None
        if self._start_jobs() and self._on_loop() > 1:
            self._poll = asyncio.get_running_loop().call_later(INBOX_POLL, self._take_inbox)
            return
        # Reset first: a request handed over from now on schedules another wake-up; one
        # handed over just before the reset is taken here.
        self._wake_pending = False
        self._start_jobs()

    def _on_loop(self) -> int:
        """Calls on the loop: accepted, or waiting for a slot."""
        return len(self._waiting) + len(self._accepted)

    def _start_jobs(self) -> int:
        loop = asyncio.get_running_loop()
        started = 0
        while self._inbox:
            self._start_job(loop, self._inbox.popleft())
            started += 1
        return started

    def _start_job(self, loop: asyncio.AbstractEventLoop, job: _Job) -> None:
        task = loop.create_task(self._run_job(job))
        self._waiting.add(task)
        task.add_done_callback(self._forget)

    def _forget(self, job: asyncio.Task[None]) -> None:
        self._waiting.discard(job)
        self._accepted.discard(job)
        if self._reader is not None:
            self._reader.room_freed()  # a slot is free: the reader may read again
        if self._poll is not None and not self._on_loop():
            # The last call ended while polling: look now, and let the next request wake
            # the loop, rather than keep it waiting for the look.
            self._poll.cancel()
            self._take_inbox()

    async def _run_job(self, job: _Job) -> None:
        async with self._slots:
            if self._closing:
                return  # never accepted: kombu puts the unacknowledged message back
            current = asyncio.current_task()
            if current is not None:
                self._waiting.discard(current)
                self._accepted.add(current)
            if job.task is None:
                # Celery's own trace, accepted and answered from the thread (apply_target).
                traced = functools.partial(
                    apply_target,
                    job.target,
                    job.args,
                    job.kwargs,
                    job.callback,
                    job.accept_callback,
                )
                try:
                    await asyncio.get_running_loop().run_in_executor(self._tools, traced)
                except Exception:  # raised outside the task body; the threads pool drops it too
                    logger.exception("Celery's trace of task %s raised", job.args[:1])
                return
            if job.accept_callback is not None:
                accept = functools.partial(
                    _call, job.accept_callback, os.getpid(), time.monotonic()
                )
                if waits_for_hold(job.accept_callback):
                    await self._io(
                        accept
                    )  # a Redis write first (executor.claims.hold): off the loop
                else:
                    accept()
            assert self._trace is not None  # made by on_start, before the loop runs a job
            result = await self._trace(job.task, job.args)
            if job.callback is not None:
                _call(job.callback, result)

    # -- shutdown -------------------------------------------------------------------------

    def _shutdown(self, *, cancel: bool) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._loop = None
        # A warm shutdown waits for every accepted call, as Celery's other pools do; a
        # cold one only COLD_GRACE seconds for the cancelled ones (a blocked loop never ends).
        grace = COLD_GRACE if cancel else None
        if not loop.is_closed() and thread.is_alive():
            drained = asyncio.run_coroutine_threadsafe(self._drain(cancel=cancel), loop)
            try:
                drained.result(grace)
            except Exception:  # shutting down regardless
                logger.exception("the asyncio pool did not drain cleanly")
            loop.call_soon_threadsafe(loop.stop)
            thread.join(grace)
        self._io.stop()
        self._tools.shutdown(wait=not cancel, cancel_futures=True)
        if not thread.is_alive():
            loop.close()

    async def _drain(self, *, cancel: bool) -> None:
        if self._reader is not None:
            await self._reader.stop()  # nothing more read; a read under way put back
        for job in list(self._waiting):
            job.cancel()
        if cancel:
            for job in list(self._accepted):
                job.cancel()
        jobs = self._waiting | self._accepted
        if jobs:
            await asyncio.gather(*jobs, return_exceptions=True)


def _call(callback: Callable[..., Any], *args: Any) -> None:
    try:
        callback(*args)
    except Exception:  # one request's bookkeeping must not stop the loop
        logger.exception("a Celery request callback of the asyncio pool failed")
