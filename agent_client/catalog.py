"""Read the tool catalog and which workers are alive.

The view is cached for a fraction of the heartbeat interval, so a call costs no extra
round trip while a dead worker's tools still disappear within about one interval. It
is read on the client's I/O thread (:mod:`agent_client._io.loop`): a call never waits for it
(a stale view is refreshed in the background while the call goes on with the spec it
has), and :meth:`Catalog.spec`, which builds proxies, waits at most a bounded time;
a caller on an event loop awaits the same read (:meth:`Catalog.spec_async`) instead.
The offset to the shared clock (:mod:`agent_client.clock`) is measured beside the reads,
on the same loop, when it is due.

A tool is *known* once a worker has published its spec, and *served* while a live
worker consumes its queue. Calls to a known tool are sent even when nothing serves it
at the moment: the message waits in its queue for a worker, within the call's deadline.

The reads also tell which workers went: one seen beating in a read and missing in a
later one, not back since, that did not say it stopped warm (:func:`wire.keys.left`: a
warm stop finishes or puts back every call it holds), while Redis took and kept this
client's own writes for an interval before it (:mod:`agent_client._io.writes`: a
heartbeat lapses in a Redis pause or full memory, and vanishes in a restart, and comes
back). The watchdog asks (:meth:`Catalog.worker_gone`) before it calls a vanished
call's worker lost.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import pydantic

from agent_client._io.link import NotSent, Refused, Unknown
from agent_client._io.loop import IOThread
from agent_client._io.writes import Writes
from agent_client.clock import ClockMeter
from agent_client.errors import BrokerUnavailable, ToolNotFound
from wire import keys
from wire.clock import SharedClock
from wire.models import ToolSpec, WorkerInfo
from wire.redis_errors import explain, tls_refusal

__all__ = ["Catalog"]

logger = logging.getLogger(__name__)

#: Seconds one read of the catalog may take.
READ_TIMEOUT = 2.0
#: Seconds between reads while :meth:`Catalog.spec` waits for a tool.
_POLL = 0.1
#: Seconds a failed background read holds back the next one.
_RETRY_AFTER = 0.25
#: Seconds a worker that went is remembered.
_GONE_MEMORY = 600.0


@dataclass(frozen=True)
class _View:
    specs: dict[str, ToolSpec] = field(default_factory=dict)
    served: dict[str, frozenset[str]] = field(default_factory=dict)
    read_at: float = -math.inf
    workers: dict[str, frozenset[str]] = field(default_factory=dict)  # live worker id -> queues
    beat_at: dict[str, float] = field(
        default_factory=dict
    )  # live worker id -> its last beat (shared clock)

    def served_spec(self, name: str) -> ToolSpec | None:
        spec = self.specs.get(name)
        return (
            spec if spec is not None and spec.queue in self.served.get(name, frozenset()) else None
        )


class _ReadFailed(Exception):
    pass


class Catalog:
    """A cached view of the specs in the catalog and the live workers serving them.

    Args:
        io: The client's I/O thread, which reads Redis.
        url: The Redis of the catalog and the heartbeats.
        max_age: Seconds a view is used before it is read again.
        clock: The process's shared clock, measured beside the reads when it is due.
    """

    def __init__(
        self,
        io: IOThread,
        url: str,
        *,
        max_age: float,
        writes: Writes,
        interval: float,
        clock: SharedClock | None = None,
    ) -> None:
        self._io = io
        self._writes = writes
        self._interval = interval
        self._url = url
        self._max_age = max_age
        self._meter = ClockMeter(io, url, clock) if clock is not None else None
        self._view = _View()
        self._reading: asyncio.Task[None] | None = None
        self._kicked = False
        self._failed_at = -math.inf
        self._gone: dict[
            str, tuple[frozenset[str], float]
        ] = {}  # worker id -> (queues, first seen gone)

    # -- the cached view: no I/O ---------------------------------------------------------

    def known(self, name: str) -> ToolSpec | None:
        """The spec of ``name`` as last read, served or not; a stale view is read again
        in the background. Never waits."""
        view = self._view
        if self._stale(view):
            self._kick()
        return view.specs.get(name)

    def invalidate(self) -> None:
        """Forget the cached view's age; the next look-up reads Redis."""
        view = self._view
        self._view = _View(view.specs, view.served, workers=view.workers, beat_at=view.beat_at)

    async def worker_gone(self, queue: str, since: float) -> bool | None:
        """Whether a worker of ``queue`` stopped beating at or after ``since`` and is still
        gone; None while that is not known yet.

        Reads the catalog first (call on the I/O loop); ``since`` is ``time.monotonic()``.
        A worker counts only if this client saw it beating before, and is gone only if
        Redis took and kept this client's own writes for the whole interval before the
        read that misses it (:mod:`agent_client._io.writes`): a heartbeat that lapsed or
        was forgotten in an outage is no death. Until then, or while the catalog cannot be
        read, the answer is None (ask again later).
        """
        try:
            await self._read()
        except Exception as exc:  # noqa: BLE001 - nothing concluded from an old read
            logger.debug(
                "could not read the catalog to look for a lost worker: %s", type(exc).__name__
            )
            return None
        if not any(queue in queues and gone_at >= since for queues, gone_at in self._gone.values()):
            return False
        # Missing in a read that found this client's own key kept, after an interval of
        # writes Redis took and kept: its key lapsed (a worker writes it three times an
        # interval, and it lives one), so the worker stopped beating. Else not known yet.
        return True if self._writes.steady_since(time.monotonic() - self._interval) else None

    async def beating_since(self, queue: str, since: float) -> bool:
        """Whether every live worker of ``queue`` has beaten at or after ``since`` (epoch
        seconds on the shared clock), as its own heartbeat writes it; reads the catalog
        first (call on the I/O loop).

        A worker kept alive while it cannot beat (its keeper, a Redis out of memory:
        ``executor.keeper``) has not beaten, so a call it may hold without a record yet
        is not taken for lost. Unreadable: False (nothing is concluded).
        """
        try:
            await self._read()
        except Exception as exc:  # noqa: BLE001 - nothing concluded from an old read
            logger.debug("could not read the catalog to see who beats: %s", type(exc).__name__)
            return False
        view = self._view
        return all(
            view.beat_at.get(w, -math.inf) >= since
            for w, queues in view.workers.items()
            if queue in queues
        )

    # -- reads that wait (bounded) ---------------------------------------------------------

    def spec(self, name: str, *, wait: float | None = None) -> ToolSpec:
        """The spec of a tool that some live worker serves, read now if the view is stale.

        Args:
            name: The tool's name.
            wait: Seconds to wait for a live worker to serve it (an agent that starts
                before its workers); by default it must be served now.

        Raises:
            ToolNotFound: No live worker serves ``name``; the message lists what exists.
            BrokerUnavailable: Redis cannot be reached.
        """
        ends = time.monotonic() + (wait or 0.0)
        while True:
            error: BrokerUnavailable | None = None
            try:
                read = self._stale(self._view)
                if read:
                    self._refresh(ends)
                found = self._view.served_spec(name)
                if found is None and not read:
                    self._refresh(ends)
                    found = self._view.served_spec(name)
                if found is not None:
                    return found
            except BrokerUnavailable as exc:
                last = self._last_served(name, exc)
                if last is not None:
                    return last
                error = exc
            left = ends - time.monotonic()
            if left <= 0:
                if error is not None:
                    raise error
                raise self._not_found(name)
            time.sleep(min(_POLL, left))

    def specs(
        self, queues: frozenset[str] | None = None, *, wait: float | None = None
    ) -> list[ToolSpec]:
        """Specs of every tool a live worker serves, by name, optionally only on ``queues``.

        Args:
            queues: Only tools on these queues.
            wait: Seconds to wait for a live worker to serve at least one such tool (an
                agent that starts before its workers); by default the view as it is now.

        Raises:
            BrokerUnavailable: Redis cannot be reached (still, after ``wait``).
        """
        ends = time.monotonic() + (wait or 0.0)
        while True:
            error: BrokerUnavailable | None = None
            try:
                if self._stale(self._view) or wait is not None:
                    self._refresh(ends)
                found = self._served(queues)
                if found or wait is None:
                    return found
            except BrokerUnavailable as exc:
                error = exc
            left = ends - time.monotonic()
            if left <= 0:
                if error is not None:
                    raise error
                return []
            time.sleep(min(_POLL, left))

    def _served(self, queues: frozenset[str] | None) -> list[ToolSpec]:
        view = self._view
        return [
            spec
            for name, spec in sorted(view.specs.items())
            if spec.queue in view.served.get(name, frozenset())
            and (queues is None or spec.queue in queues)
        ]

    def available(self, *, read: bool = True) -> list[str]:
        """Names of the tools a live worker serves; with ``read=False``, from the view as is."""
        if not read:
            view = self._view
            return sorted(name for name in view.specs if view.served_spec(name) is not None)
        return [spec.name for spec in self.specs()]

    # -- the same reads, awaited: for a caller on an event loop --------------------------

    async def spec_async(self, name: str, *, timeout: float = READ_TIMEOUT) -> ToolSpec:
        """:meth:`spec` (without ``wait``) for a caller on an event loop: the read is awaited.

        Args:
            name: The tool's name.
            timeout: Seconds a read of Redis may take.

        Raises:
            ToolNotFound: No live worker serves ``name``.
            BrokerUnavailable: Redis cannot be read within ``timeout``.
        """
        read = self._stale(self._view)
        try:
            if read:
                await self._refresh_async(timeout)
            found = self._view.served_spec(name)
            if found is None and not read:
                await self._refresh_async(timeout)
                found = self._view.served_spec(name)
        except BrokerUnavailable as exc:
            found = self._last_served(name, exc)
            if found is None:
                raise
        if found is None:
            raise self._not_found(name)
        return found

    def _last_served(self, name: str, error: BrokerUnavailable) -> ToolSpec | None:
        """While Redis cannot be read: the spec of ``name`` as the last read saw it served,
        if any. A proxy built from it calls as any proxy does: each call is sent again
        and again until its own deadline, and ends in its result if Redis comes back."""
        found = self._view.served_spec(name)
        if found is not None:
            age = time.monotonic() - self._view.read_at
            logger.info(
                "%s; tool %r is served as the catalog read %.1fs ago saw it", error, name, age
            )
        return found

    async def specs_async(
        self, queues: frozenset[str] | None = None, *, timeout: float = READ_TIMEOUT
    ) -> list[ToolSpec]:
        """:meth:`specs` for a caller on an event loop: the read is awaited."""
        if self._stale(self._view):
            await self._refresh_async(timeout)
        return self._served(queues)

    async def _refresh_async(self, timeout: float) -> None:
        try:
            await self._io.run_async(self._read, timeout=timeout)
        except TimeoutError:
            raise BrokerUnavailable(
                f"cannot read the tool catalog from Redis within {timeout:g}s"
            ) from None
        except _ReadFailed as exc:
            raise BrokerUnavailable(f"cannot read the tool catalog from Redis: {exc}") from None

    def _not_found(self, name: str) -> ToolNotFound:
        spec = self._view.specs.get(name)
        if spec is None:
            return ToolNotFound(
                name, self.available(read=False), reason="no worker has published it"
            )
        return ToolNotFound(
            name,
            self.available(read=False),
            reason=f"no live worker serves it on queue {spec.queue!r}",
        )

    def _refresh(self, ends: float) -> None:
        timeout = max(READ_TIMEOUT, ends - time.monotonic())
        try:
            self._io.run(self._read, timeout=timeout)
        except TimeoutError:
            raise BrokerUnavailable(
                f"cannot read the tool catalog from Redis within {timeout:g}s"
            ) from None
        except _ReadFailed as exc:
            # A dropped TLS connection may be the server refusing this client's certificate.
            reason = tls_refusal(self._url, str(exc)) or exc
            raise BrokerUnavailable(f"cannot read the tool catalog from Redis: {reason}") from None

    # -- reading, on the I/O thread --------------------------------------------------------

    def _stale(self, view: _View) -> bool:
        return time.monotonic() - view.read_at >= self._max_age

    def _kick(self) -> None:
        # One background read at a time, and none right after a failed one.
        if self._kicked or time.monotonic() - self._failed_at < _RETRY_AFTER:
            return
        self._kicked = True
        self._io.call_soon(self._read_in_background)

    def _read_in_background(self) -> None:
        task = self._start_reading()

        def done(finished: asyncio.Task[None]) -> None:
            self._kicked = False
            if finished.cancelled() or finished.exception() is not None:
                self._failed_at = time.monotonic()

        task.add_done_callback(done)

    def _start_reading(self) -> asyncio.Task[None]:
        task = self._reading
        if task is None or task.done():
            task = self._reading = asyncio.get_running_loop().create_task(self._read_once())
        return task

    async def _read(self) -> None:
        # Shielded: a caller that stops waiting does not cut the read short for the others.
        await asyncio.shield(self._start_reading())
        measuring = self._meter.kick() if self._meter is not None else None
        if measuring is not None:
            # A proxy's first call then already runs on the shared clock (bounded: a
            # few TIME round trips of ROUND_TRIP_TIMEOUT each).
            await asyncio.shield(measuring)

    async def _read_once(self) -> None:
        if self._meter is not None:
            self._meter.kick()  # beside the read, whatever becomes of it
        link = self._io.link(self._url, "read")
        try:
            # Beside the read, this client's own liveness key: missing though written within
            # its life, Redis restarted or stalled, and this read is no evidence of a death.
            first = await link.execute(
                [
                    ("HGETALL", keys.CATALOG),
                    ("SMEMBERS", keys.WORKERS),
                    ("EXISTS", self._writes.key),
                ],
                timeout=READ_TIMEOUT,
            )
            raw_specs, worker_ids, witness = (_ok(reply) for reply in first)
            self._writes.seen(exists=bool(witness))
            ids = sorted(w.decode() if isinstance(w, bytes) else str(w) for w in worker_ids)
            beats: list[Any] = []
            if ids:
                beats = _ok(
                    (
                        await link.execute(
                            [("MGET", *(keys.worker(w) for w in ids))], timeout=READ_TIMEOUT
                        )
                    )[0]
                )
            dead = [w for w, beat in zip(ids, beats, strict=True) if beat is None]
            if dead:
                await link.execute([("SREM", keys.WORKERS, *dead)], timeout=READ_TIMEOUT)
            view = _parse(raw_specs, beats)
            # Of the workers that went since the last read, those that stopped warm said
            # so as they left (wire.keys.left): they took no call with them.
            went = sorted(set(self._view.workers) - set(view.workers))
            left: set[str] = set()
            if went:
                said = _ok(
                    (
                        await link.execute(
                            [("MGET", *(keys.left(w) for w in went))], timeout=READ_TIMEOUT
                        )
                    )[0]
                )
                left = {w for w, word in zip(went, said, strict=True) if word is not None}
        except NotSent as exc:
            raise _ReadFailed(explain(exc.__cause__ or exc)) from None
        self._note_departures(view, left)

    def _note_departures(self, view: _View, left: set[str]) -> None:
        for worker_id, queues in self._view.workers.items():
            if worker_id not in view.workers and worker_id not in left:
                self._gone.setdefault(worker_id, (queues, view.read_at))
        for worker_id in view.workers:
            self._gone.pop(worker_id, None)  # beating again: a lapse, not a death
        forget = view.read_at - _GONE_MEMORY
        self._gone = {w: gone for w, gone in self._gone.items() if gone[1] >= forget}
        self._view = view


def _ok(reply: Any) -> Any:
    if isinstance(reply, Refused | Unknown):
        raise _ReadFailed(explain(reply.error))
    return reply


def _parse(raw_specs: dict[bytes, bytes] | list[bytes], beats: list[Any]) -> _View:
    served: dict[str, set[str]] = {}
    workers: dict[str, frozenset[str]] = {}
    beat_at: dict[str, float] = {}
    for beat in beats:
        if beat is None:
            continue
        try:
            info = WorkerInfo.model_validate_json(beat)
        except pydantic.ValidationError:
            continue
        workers[info.worker_id] = frozenset(info.queues)
        beat_at[info.worker_id] = info.beat_at
        for tool in info.tools:
            served.setdefault(tool, set()).update(info.queues)
    specs: dict[str, ToolSpec] = {}
    # HGETALL: a map in RESP3, a flat list (name, spec, name, spec, ...) in RESP2.
    for raw in raw_specs.values() if isinstance(raw_specs, dict) else raw_specs[1::2]:
        try:
            spec = ToolSpec.model_validate_json(raw)
        except pydantic.ValidationError:
            continue
        specs[spec.name] = spec
    served_by = {name: frozenset(queues) for name, queues in served.items()}
    return _View(specs, served_by, time.monotonic(), workers, beat_at)
