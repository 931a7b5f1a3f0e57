"""The client's half of the run log (:mod:`wire.runlog`): each call as its caller saw it.

A :class:`RunLog` lives on the client's I/O thread. Events are added there (or handed
there from a caller's thread, :meth:`RunLog.add_soon`) and written in one pipeline, on a
connection of their own: a log write never delays a send, is never part of one, and is
not sent again when it fails (the log is for people; a call's fate never depends on it).
A flush goes out on the next turn of the I/O loop, but at most one starts every
:data:`FLUSH_GAP`: under load a pipeline carries the events of many calls, not of one or
two. The client's close sends what is left at once.

Every pipeline that may make a key also sets its TTL, so no fault leaves a key without
one (a Redis that refused the write, or lost it in a restart): each run a flush writes to
has its log's TTL set in that flush, and a flush that adds to the recent-runs index
(:data:`wire.keys.RUNS`) sets the index's TTL (it lives as long as the newest run). A
run's place in the index is written when it first writes, then at most once every
:data:`REFRESH_GAP` (a TTL of hours loses nothing by a second), and the index is pruned
of runs older than the TTL as often; a write Redis did not take is made again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import weakref

from agent_client._io.callstate import OP_TIMEOUT, Send
from agent_client._io.link import NotSent
from agent_client._io.loop import IOThread
from wire import keys
from wire.resp import Arg
from wire.runlog import JOINED, SENT, event, now_ms, run_of, xadd_arguments
from wire.settings import Settings

__all__ = ["RunLog"]

logger = logging.getLogger(__name__)

#: Events one pipeline carries at most; a flush sends several when it holds more.
_BATCH = 500
#: Events the client keeps unsent at most (Redis slow to answer); the oldest go first.
_MAX_PENDING = 10_000
#: Seconds from one flush's start to the next's, at least.
FLUSH_GAP = 0.05
#: Seconds between two writes of a run's place in the recent-runs index, and two prunes.
REFRESH_GAP = 1.0


class RunLog:
    """The events of this client's calls on their way to their runs' logs.

    Args:
        io: The client's I/O thread.
        settings: ``redis_url`` (where the logs live), ``run_log`` (False: log
            nothing), ``run_log_ttl`` and ``run_log_max``.
    """

    def __init__(self, io: IOThread, settings: Settings) -> None:
        self._io = io
        self._url = settings.redis_url
        self._on = settings.run_log
        self._ttl_ms = settings.run_log_ttl * 1000
        self._max = settings.run_log_max
        self._pending: list[tuple[str, dict[str, str]]] = []
        self._flushing: asyncio.Task[None] | None = None
        self._waiting = False  # the flush under way waits out FLUSH_GAP: nothing sent yet
        self._last_flush_at = -math.inf
        #: When Redis took each run's place in the index, and the last prune
        #: (``time.monotonic()``).
        self._indexed: dict[str, float] = {}
        self._pruned_at = -math.inf
        #: Whether the last flush is registered to run as the I/O thread stops, and
        #: whether it has started (from then on, nothing more is taken).
        self._closing = False
        self._final = False
        #: The I/O thread's loop these flags are of (the thread starts a new one on its
        #: next use after a stop).
        self._loop: weakref.ref[asyncio.AbstractEventLoop] | None = None

    @property
    def on(self) -> bool:
        """Whether this client logs its calls (``TOOLEXEC_RUN_LOG``)."""
        return self._on

    def sent(self, items: list[Send]) -> None:
        """Log each of ``items`` as sent, once, now that its broker took it (I/O thread);
        and as joined where its claim joined another call's execution or its stored outcome."""
        if not self._on:
            return
        for item in items:
            if item.logged or not item.state.confirmed:
                continue
            item.logged = True
            request = item.call.request
            run = run_of(request.run_id, request.reply_to)
            deadline = None if request.deadline is None else int(request.deadline * 1000)
            self.add(
                run,
                event(
                    SENT,
                    request.call_id,
                    {
                        "tool": request.tool,
                        "queue": item.call.spec.queue,
                        "key": request.idempotency_key,
                        "deadline": deadline,
                    },
                    at=item.made_at,
                ),
            )
            if item.state.joined or item.state.stored:
                stored = "1" if item.state.stored else None
                self.add(run, event(JOINED, request.call_id, {"stored": stored}))

    def add(self, run: str, entry: dict[str, str]) -> None:
        """Queue one event of ``run`` for the next flush (I/O thread)."""
        if not self._on:
            return
        loop = asyncio.get_running_loop()
        if self._loop is None or self._loop() is not loop:  # a first run, or one after a stop
            self._loop, self._flushing = weakref.ref(loop), None
            self._closing = self._final = self._waiting = False
        if self._io.stopping():
            # The thread stops: only the last flush, if it is still to come, sends more;
            # a flush started now could open a connection nobody would close.
            if self._closing and not self._final:
                self._pending.append((run, entry))
            return
        if not self._closing:
            self._closing = True
            self._io.on_close(self._last_flush)
        self._pending.append((run, entry))
        if len(self._pending) > _MAX_PENDING:
            del self._pending[0]
        if self._flushing is None or self._flushing.done():
            self._flushing = loop.create_task(self._flush())

    def add_soon(self, run: str, entry: dict[str, str]) -> None:
        """:meth:`add`, from any thread; nothing once the client's I/O thread has stopped."""
        if self._on:
            with contextlib.suppress(RuntimeError):  # its loop is closed: the client closed
                self._io.call_soon(self.add, run, entry)

    async def _flush(self) -> None:
        gap = self._last_flush_at + FLUSH_GAP - time.monotonic()
        self._waiting = True
        try:
            # This turn's other events come along, and under load those of the gap.
            await asyncio.sleep(0 if self._final else max(0.0, gap))
        finally:
            self._waiting = False
        self._last_flush_at = time.monotonic()
        link = self._io.link(self._url, "runlog")
        while self._pending:
            batch, self._pending = self._pending[:_BATCH], self._pending[_BATCH:]
            commands, indexed, pruned = self._commands(batch)
            try:
                await link.execute(commands, timeout=OP_TIMEOUT)
            except NotSent as exc:
                logger.debug("run log: dropped %d events: %s", len(batch), exc)
                continue
            for run in indexed:
                self._indexed[run] = self._last_flush_at
            if pruned:
                self._pruned_at = self._last_flush_at
                self._indexed = {
                    run: at
                    for run, at in self._indexed.items()
                    if self._last_flush_at - at < REFRESH_GAP
                }

    async def _last_flush(self) -> None:
        # The client closes: what it holds goes now, within the I/O thread's wind-down.
        self._final = True
        if self._flushing is not None and not self._flushing.done():
            if self._waiting:  # it has sent nothing yet: this flush sends it all
                self._flushing.cancel()
            await asyncio.gather(self._flushing, return_exceptions=True)
        await self._flush()

    def _commands(
        self, batch: list[tuple[str, dict[str, str]]]
    ) -> tuple[list[tuple[Arg, ...]], list[str], bool]:
        """The pipeline of ``batch``; the runs whose places in the index it writes, and
        whether it prunes the index."""
        commands: list[tuple[Arg, ...]] = []
        runs: dict[str, None] = {}
        for run, entry in batch:
            commands.append(tuple(xadd_arguments(keys.run_log(run), entry, max_events=self._max)))
            runs[run] = None
        for run in runs:  # with the XADDs that may have made it
            commands.append(("PEXPIRE", keys.run_log(run), self._ttl_ms))
        now, moment = now_ms(), time.monotonic()
        due = [run for run in runs if moment - self._indexed.get(run, -math.inf) >= REFRESH_GAP]
        for run in due:
            commands.append(("ZADD", keys.RUNS, now, run))
        prune = moment - self._pruned_at >= REFRESH_GAP
        if prune:
            commands.append(("ZREMRANGEBYSCORE", keys.RUNS, "-inf", now - self._ttl_ms))
        if due or prune:  # with the ZADDs that may have made it
            commands.append(("PEXPIRE", keys.RUNS, self._ttl_ms))
        return commands, due, prune
