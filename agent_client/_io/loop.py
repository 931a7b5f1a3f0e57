"""The client's one background thread: an asyncio loop that does all of its Redis I/O.

Every Redis command the client sends runs here, on redis-py's asyncio client, bounded
by a timeout: the sends (:mod:`agent_client._io.send`), the reply listener
(:mod:`agent_client._io.replies`), the watchdog and the catalog reads. A caller never
waits on a socket: a sync caller waits on a future with its own deadline and an async
caller awaits one on its own loop, so neither a frozen Redis nor a slow one can hold a
caller past its deadline or stall its event loop.

Each command goes over a :class:`~agent_client._io.link.Link` of the thread's (one per
server and role). The thread owns its loop and its links and closes them itself,
whatever stops it; in a forked child it lets go of the parent's without touching them
(:func:`reset_after_fork`, which resets the client's own objects in a child too).

The thread settles the futures its callers wait on (:func:`settle_from_thread`): a sync
caller waits on a ``concurrent.futures.Future``; an async caller on an
``asyncio.Future`` of its own loop, which only that loop's thread may touch. Many are
settled at once: one ``call_soon_threadsafe`` per loop per batch, not one wake-up per
reply.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import selectors
import socket
import stat
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypeVar

from agent_client._io.link import Link

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: The name of the client's one background thread, which does all of its I/O.
THREAD_NAME = "toolexec-client-io"

#: Seconds a stopping thread has, after the orderly part of the stop, to cancel what is
#: left and close its connections and its loop (nothing in it waits on a server).
_TEARDOWN = 1.0


# -- settling futures across threads ---------------------------------------------------

#: The future a waiting caller holds: a sync caller's or one of its event loop's.
Waiter: TypeAlias = "concurrent.futures.Future[Any] | asyncio.Future[Any]"


def settle(future: Waiter, *, result: Any = None, error: BaseException | None = None) -> None:
    """Set a result or error on a future owned by the current thread (or a sync one)."""
    if isinstance(future, asyncio.Future):
        if not future.done():
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)
        return
    with contextlib.suppress(concurrent.futures.InvalidStateError):  # the caller gave up
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


def settle_from_thread(items: Iterable[tuple[Waiter, Any, BaseException | None]]) -> None:
    """Settle futures from a foreign thread: sync ones now, async ones on their loops."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Waiter, Any, BaseException | None]]] = {}
    for future, result, error in items:
        if isinstance(future, asyncio.Future):
            by_loop.setdefault(future.get_loop(), []).append((future, result, error))
        else:
            settle(future, result=result, error=error)
    for loop, batch in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(_settle_all, batch)


def _settle_all(batch: list[tuple[Waiter, Any, BaseException | None]]) -> None:
    for future, result, error in batch:
        settle(future, result=result, error=error)


# -- the thread ---------------------------------------------------------------------


@dataclass(eq=False, kw_only=True)
class _Run:
    """One start of the thread: its loop, and what lives on that loop until it closes."""

    loop: asyncio.AbstractEventLoop
    pid: int
    thread: threading.Thread | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    links: dict[tuple[str, str], Link] = field(default_factory=dict)
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    #: When the orderly part of the stop must end (``time.monotonic()``), set by the stop.
    stop_by: float = 0.0


class IOThread:
    """The client's background thread and its event loop, started on first use.

    The loop lives and dies on its thread, as under ``asyncio.run``: whatever ends it,
    the thread cancels what is left, closes every connection and then the loop itself.
    In a forked child the parent's thread is gone and its loop and connections are the
    parent's: they are let go of without being touched (:func:`_forget`), and the next
    use starts a thread of the child's own.

    Args:
        services: Coroutines started with the loop and run until it closes (the reply
            listener, the watchdog's ticks).
        sentinel_master: The group a ``sentinel://`` URL names (``wire.connect``).
    """

    def __init__(
        self,
        services: Sequence[Callable[[], Coroutine[Any, Any, None]]] = (),
        *,
        sentinel_master: str | None = None,
    ) -> None:
        self._services = list(services)
        self._sentinel_master = sentinel_master
        self._lock = threading.Lock()
        self._current: _Run | None = None
        #: Every run whose loop is not closed yet, by loop (a stopping one ends on its own).
        self._runs: dict[asyncio.AbstractEventLoop, _Run] = {}
        _threads.add(self)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop, running in its thread (started now if needed)."""
        run = self._current
        if run is None:
            with self._lock:
                if self._current is None:
                    self._current = self._start()
                run = self._current
        return run.loop

    @property
    def running(self) -> bool:
        """Whether the thread runs."""
        run = self._current
        return run is not None and run.thread is not None and run.thread.is_alive()

    def in_thread(self) -> bool:
        """Whether the caller runs on this thread (or on one of its that is stopping)."""
        me = threading.current_thread()
        return any(run.thread is me for run in list(self._runs.values()))

    def _start(self) -> _Run:
        run = _Run(loop=asyncio.new_event_loop(), pid=os.getpid())
        started = threading.Event()
        run.thread = threading.Thread(
            target=self._serve, args=(run, started), name=THREAD_NAME, daemon=True
        )
        self._runs[run.loop] = run
        run.thread.start()
        started.wait()
        return run

    def _serve(self, run: _Run, started: threading.Event) -> None:
        # The loop's whole life, on its thread. The finally clause is why nothing the
        # loop opened is ever left to the garbage collector: not after a stop that took
        # longer than its caller waited, not after an error.
        loop = run.loop
        asyncio.set_event_loop(loop)
        try:
            run.tasks = [loop.create_task(service()) for service in self._services]
            loop.call_soon(started.set)
            loop.run_forever()
            loop.run_until_complete(self._wind_down(run))
        finally:
            started.set()
            try:
                loop.run_until_complete(_release(run))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                asyncio.set_event_loop(None)
                self._runs.pop(loop, None)
                loop.close()

    async def _wind_down(self, run: _Run) -> None:
        # The orderly part of a stop, within its time: the services end, then the closers
        # run (a lane releases the claims of the calls it never sent).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, run.stop_by - time.monotonic())):
                for task in run.tasks:
                    task.cancel()
                await asyncio.gather(*run.tasks, return_exceptions=True)
                closers, run.closers = run.closers, []
                for closer in closers:
                    with contextlib.suppress(Exception):
                        await closer()

    def _here(self) -> _Run:
        run = self._runs.get(asyncio.get_running_loop())
        if run is None:
            raise RuntimeError("not on the loop of this I/O thread")
        return run

    def link(self, url: str, role: str) -> Link:
        """The connection to ``url`` for ``role`` (call on the loop's thread)."""
        links = self._here().links
        link = links.get((url, role))
        if link is None:
            link = links[(url, role)] = Link(url, master=self._sentinel_master)
        return link

    def stopping(self) -> bool:
        """Whether the thread is stopping: its closers run, or have run (call on the loop's
        thread). Nothing may open a connection from then on."""
        return self._here().stop_by > 0

    def on_close(self, closer: Callable[[], Awaitable[None]]) -> None:
        """Run ``closer`` on the loop when the thread stops (call on the loop's thread)."""
        self._here().closers.append(closer)

    def call_soon(self, callback: Callable[..., object], *args: Any) -> None:
        """Run ``callback(*args)`` on the loop, from any thread."""
        self.loop.call_soon_threadsafe(callback, *args)

    def submit(self, work: Callable[[], Coroutine[Any, Any, T]]) -> concurrent.futures.Future[T]:
        """Run the coroutine ``work()`` on the loop; its future, from any thread."""
        return asyncio.run_coroutine_threadsafe(work(), self.loop)

    def run(self, work: Callable[[], Coroutine[Any, Any, T]], *, timeout: float | None) -> T:
        """Run ``work()`` on the loop and block this thread for its result.

        Raises:
            TimeoutError: It took longer than ``timeout``; it is cancelled.
        """
        if self.in_thread():
            raise RuntimeError("IOThread.run called on its own thread")
        future = self.submit(work)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError from None

    async def run_async(
        self, work: Callable[[], Coroutine[Any, Any, T]], *, timeout: float | None
    ) -> T:
        """Run ``work()`` on the loop and await its result on the caller's loop.

        Raises:
            TimeoutError: It took longer than ``timeout``; it is cancelled.
        """
        mine: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        future = self.submit(work)

        def done(finished: concurrent.futures.Future[T]) -> None:
            if finished.cancelled():
                return
            error = finished.exception()
            settle_from_thread([(mine, None if error else finished.result(), error)])

        future.add_done_callback(done)
        try:
            return await asyncio.wait_for(mine, timeout)
        except BaseException:
            future.cancel()
            raise

    def close(self, timeout: float = 2.0) -> None:
        """Stop the thread, closing every connection and the loop; the next use starts it again.

        The services are cancelled and the closers run for up to ``timeout`` seconds;
        then the thread cancels what is left and closes the connections and the loop.
        This waits for all of it, :data:`_TEARDOWN` past ``timeout`` at most; a thread
        that takes longer still closes everything when it gets there.
        """
        with self._lock:
            run, self._current = self._current, None
        if run is None or run.thread is None:
            return
        if run.pid != os.getpid():  # forked without the fork hook: the run is the parent's
            self._runs.pop(run.loop, None)
            _forget(run)
            return
        stop_by = time.monotonic() + timeout
        if run.thread is threading.current_thread():  # from a callback on the loop
            _stop(run, stop_by)  # the loop winds down once the callback returns
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the thread has ended
            run.loop.call_soon_threadsafe(_stop, run, stop_by)
        run.thread.join(timeout + _TEARDOWN)

    def _after_fork_in_child(self) -> None:
        # Only this thread is left in the child: whoever held the lock in the parent is gone.
        self._lock = threading.Lock()
        self._current = None
        runs, self._runs = list(self._runs.values()), {}
        for run in runs:
            _forget(run)


def _stop(run: _Run, stop_by: float) -> None:
    run.stop_by = stop_by
    run.loop.stop()


async def _release(run: _Run) -> None:
    # What is left as a loop ends, whatever ended it: every other task is cancelled (a
    # catalog read under way, a send), then every connection closed. Nothing waits on a server.
    current = asyncio.current_task()
    others = [task for task in asyncio.all_tasks() if task is not current]
    for task in others:
        task.cancel()
    if others:
        done, _ = await asyncio.wait(others, timeout=_TEARDOWN)
        for task in done:
            if not task.cancelled():
                task.exception()  # retrieved: an error on the way out is not logged as lost
    links, run.links = run.links, {}
    for link in links.values():
        await link.close()


#: Every I/O thread of this process, for the fork hook.
_threads: weakref.WeakSet[IOThread] = weakref.WeakSet()
#: The runs a forked child inherited, and what their selectors held, kept referenced for
#: good (see :func:`_forget`).
_forgotten: list[tuple[_Run, tuple[selectors.SelectorKey, ...]]] = []


def _forget(run: _Run) -> None:
    """In a forked child: let go of a run of the parent's, touching nothing the parent uses.

    No coroutine of the parent's runs here, nothing is written, and the loop's epoll set
    (one the parent shares) is left as it is. Only this process's copies of the file
    descriptors are closed, so that the parent's connections end when the parent closes
    them. Everything stays referenced, the selector's registrations too: collected, a
    task's coroutine would be closed, running the parent's clean-up code in this process,
    and a stream writer would close its transport, unregistering it from the shared set.
    """
    selector = getattr(run.loop, "_selector", None)
    if not isinstance(selector, selectors.BaseSelector):
        _forgotten.append((run, ()))
        return  # a loop of another kind: nothing here is known to be safe to close
    registered = tuple(selector.get_map().values())
    _forgotten.append((run, registered))
    for link in run.links.values():
        link.forget()
    pipe = [getattr(run.loop, name, None) for name in ("_ssock", "_csock")]
    pipe_fds = {sock.fileno() for sock in pipe if isinstance(sock, socket.socket)}
    for key in registered:
        # A socket the parent was still connecting as it forked (a link's first connect,
        # waiting in the selector for the connect to complete) belongs to no connection
        # a link knows yet: close this process's copy too. Those the links closed are
        # gone already; only this thread runs in the child, so no number was reused.
        if key.fd not in pipe_fds and _is_socket(key.fd):
            os.close(key.fd)
    # The selector's and the self-pipe's descriptors: closing this process's copy of an
    # epoll descriptor leaves its set alone, where unregistering a socket would not.
    selector.close()
    for sock in pipe:
        if isinstance(sock, socket.socket):
            sock.close()


def _is_socket(fd: int) -> bool:
    """Whether ``fd`` is open in this process and is a socket."""
    try:
        return stat.S_ISSOCK(os.fstat(fd).st_mode)
    except OSError:
        return False


def reset_after_fork(live: weakref.WeakSet[T], reset: Callable[[T], None], *, what: str) -> None:
    """In every forked child, call ``reset`` on each of ``live`` (registered once, now).

    A failure is logged (``could not <what> after fork``) and never raised: a fork
    must never fail because of us.
    """

    def after_fork_in_child() -> None:
        for each in list(live):
            try:
                reset(each)
            except Exception as exc:  # noqa: BLE001 - a fork must never fail because of us
                logger.warning("could not %s after fork: %s", what, type(exc).__name__)

    os.register_at_fork(after_in_child=after_fork_in_child)


reset_after_fork(_threads, IOThread._after_fork_in_child, what="let go of the parent's I/O thread")
