"""The process's connection to toolexec: send calls, wait for their outcomes.

One :class:`ToolClient` per process (:func:`get_client`) holds the catalog view, the
reply router, the lost-call watchdog and the publisher, all driven by one background
thread (:mod:`agent_client._io.loop`) that does every Redis round trip. A call is
prepared (:mod:`agent_client.prepare`), sent (:mod:`agent_client._io.send`) and waited
for until its deadline (:mod:`agent_client.deadline`); ``call`` (async) and
``call_sync`` drive the same attempts loop, :meth:`ToolClient.attempts`, whose outcome
becomes a result or an error (:func:`agent_client.errors.result_of`). The caller itself
never waits on a socket, so only its deadline ends its wait, whatever Redis does.

A client survives ``fork()``: in the child it takes a new client id (a new reply list),
thread and connections, and forgets the parent's waiting calls; proxies work in both.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from agent_client._io.callstate import OP_TIMEOUT, SEND_STALL, CallState, Send
from agent_client._io.cancels import abandoned
from agent_client._io.link import Refused, Unknown
from agent_client._io.loop import IOThread, Waiter, reset_after_fork, settle
from agent_client._io.replies import ProgressReceiver, ReplyRouter
from agent_client._io.runlog import RunLog
from agent_client._io.send import LoopBatcher, Publisher
from agent_client._io.watchdog import Watchdog
from agent_client._io.writes import Writes
from agent_client.abandon import OnAbandon, with_on_abandon
from agent_client.calls import record_sent
from agent_client.catalog import Catalog
from agent_client.deadline import Attempts, drive_async, drive_sync, time_left
from agent_client.errors import RemoteToolError, ToolTimeoutError, deadline_error, result_of
from agent_client.options import CallOptions
from agent_client.prepare import PreparedCall, prepare_call
from agent_client.progress import ProgressSink
from agent_client.runs import StoredOutcomes, current_run_id
from agent_client.validation import ArgumentValidator
from wire import clock as wire_clock
from wire import keys
from wire.models import CallOutcome, ErrorKind, ToolSpec, should_store
from wire.runlog import ABANDONED, ANSWERED, FAILED, JOINED, SENT, TIMEOUT, event, now_ms, run_of
from wire.settings import Settings
from wire.urls import AMQP_SCHEMES, REDIS_SCHEMES

__all__ = ["AttemptWatch", "ToolClient", "configure", "get_client", "joined_an_expired_call"]

logger = logging.getLogger(__name__)

#: The brokers a client publishes to (a worker also takes kombu's in-memory one).
_BROKER_SCHEMES = (*REDIS_SCHEMES, *AMQP_SCHEMES)


class AttemptWatch(Protocol):
    """What a held call (``CallHandle``) is told of its attempts."""

    def sent(self, call: PreparedCall, state: CallState | None) -> None:
        """An attempt was handed to the I/O thread (``state`` None: answered from the store)."""

    def answered(self, call: PreparedCall, outcome: CallOutcome) -> None:
        """The outcome that ends the call arrived (before it becomes a result or error)."""


class ToolClient:
    """Dispatches calls to workers and waits for their outcomes."""

    def __init__(self, settings: Settings) -> None:
        if not settings.broker_url.startswith(_BROKER_SCHEMES):
            raise ValueError(
                "toolexec's client publishes to a Redis or RabbitMQ (amqp://) broker; "
                f"TOOLEXEC_BROKER_URL is {settings.broker_url.split('://')[0]}://..."
            )
        self.settings = settings
        self.stored = StoredOutcomes(ttl=settings.outcome_ttl)
        self._validators: dict[str, tuple[ToolSpec, ArgumentValidator]] = {}
        self._numbers = itertools.count(1)
        self._equal_specs: dict[str, tuple[ToolSpec, ToolSpec]] = {}
        self._connect()
        _live.add(self)

    def _connect(self) -> None:
        """Everything that belongs to this process: id, thread, connections, waiting calls."""
        settings = self.settings
        self.client_id = uuid.uuid4().hex
        self._pid = os.getpid()
        self._origin = f"toolexec-client@{self._pid}"
        self.io = IOThread(
            services=[self._listen, self._tick, self._beat],
            sentinel_master=settings.sentinel_master,
        )
        #: Whether this client's liveness key has been written since its thread started:
        #: from then on its calls ask workers to shed them should it die (``caller_beats``).
        self.beating = False
        #: Whether Redis has been taking this client's beats: no worker is taken for dead
        #: on a look Redis could not have let it answer (agent_client._io.writes).
        self.writes = Writes(keys.caller(self.client_id), settings.heartbeat_interval)
        self.catalog = Catalog(
            self.io,
            settings.redis_url,
            max_age=min(1.0, settings.heartbeat_interval / 2),
            writes=self.writes,
            interval=settings.heartbeat_interval,
            clock=wire_clock.shared_clock,
        )
        self.replies = ReplyRouter(
            self.io,
            settings.redis_url,
            keys.reply(self.client_id),
            block=min(1.0, settings.heartbeat_interval),
        )
        #: Each call's life as this client sees it, in its run's log (wire.runlog).
        self.runlog = RunLog(self.io, settings)
        self.publisher = Publisher(
            self.io,
            broker_url=settings.broker_url,
            store_url=settings.redis_url,
            runlog=self.runlog,
        )
        self.watchdog = Watchdog(
            self.replies,
            self.io,
            store_url=settings.redis_url,
            broker_url=settings.broker_url,
            interval=settings.heartbeat_interval,
            max_deliveries=settings.max_deliveries,
            worker_gone=self.catalog.worker_gone,
            beating_since=self.catalog.beating_since,
            writes=self.writes,
            runlog=self.runlog,
        )
        self._batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopBatcher] = (
            weakref.WeakKeyDictionary()
        )

    # -- the background thread's services ------------------------------------------------

    async def _listen(self) -> None:
        await self.replies.listen()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_interval)
            try:
                await self.watchdog.check()
            except Exception as exc:  # noqa: BLE001 - the next round tries again
                logger.debug(
                    "the watchdog could not look at the waiting calls: %s", type(exc).__name__
                )

    async def _beat(self) -> None:
        # That this client still waits (wire.keys.caller): a worker sheds a queued call
        # whose caller's key stays absent while Redis takes writes (executor.callers).
        # One interval long, written three times an interval; while Redis refuses writes
        # for want of memory, kept alive with PEXPIRE.
        link = self.io.link(self.settings.redis_url, "beat")
        key, life = keys.caller(self.client_id), int(self.settings.heartbeat_interval * 1000)

        async def leave() -> None:  # closed: its calls still queued are shed at once
            # Used again, it asks for shedding only once its key says it waits again.
            self.beating = False
            gone_for = life * keys.CALLER_GONE_BEATS
            await link.execute([("SET", key, "gone", "PX", gone_for)], timeout=OP_TIMEOUT)

        self.io.on_close(leave)
        while True:
            try:
                (reply,) = await link.execute(
                    [("SET", key, "1", "PX", life, "GET")], timeout=OP_TIMEOUT
                )
                if isinstance(reply, Refused | Unknown):
                    self.writes.refused()
                else:
                    self.writes.taken(kept=reply is not None)
                if isinstance(reply, Refused):
                    (reply,) = await link.execute([("PEXPIRE", key, life)], timeout=OP_TIMEOUT)
                if not isinstance(reply, Refused | Unknown):
                    self.beating = True
            except Exception as exc:  # noqa: BLE001 - Redis away, or anything else: the next beat tries again
                self.writes.refused()
                logger.debug("could not write this client's liveness: %s", type(exc).__name__)
            await asyncio.sleep(self.settings.heartbeat_interval / 3)

    # -- one attempt -----------------------------------------------------------------

    def validator(self, spec: ToolSpec) -> ArgumentValidator:
        """The compiled validator of ``spec``'s schema (compiled once per spec)."""
        cached = self._validators.get(spec.name)
        # Compared by identity first: comparing two models on every call costs.
        if cached is None or (cached[0] is not spec and cached[0] != spec):
            cached = (
                spec,
                ArgumentValidator(
                    spec.name, spec.parameters, max_bytes=self.settings.max_argument_bytes
                ),
            )
            self._validators[spec.name] = cached
        return cached[1]

    def validate(self, spec: ToolSpec, arguments: dict[str, Any]) -> None:
        """Check ``arguments`` against ``spec``'s schema; raise ToolArgumentsInvalid if not."""
        self.validator(spec).check(arguments)

    def prepare(
        self,
        spec: ToolSpec,
        arguments: dict[str, Any],
        *,
        timeout: float | None,
        run_id: str | None = None,
        idempotency_key: str | None = None,
        handle: bool = False,
        on_abandon: OnAbandon | None = None,
    ) -> PreparedCall:
        """Validate, key and encode one call (no I/O: the catalog view is read as cached).

        A call to a tool that no live worker serves at the moment is prepared all the
        same: its message waits in the queue for a worker, within its deadline.
        ``on_abandon`` overrides the tool's own (:mod:`agent_client.abandon`).

        Raises:
            ToolArgumentsInvalid: The arguments do not fit; nothing is sent.
        """

        def build(spec: ToolSpec) -> PreparedCall:
            return prepare_call(
                with_on_abandon(spec, on_abandon),
                arguments,
                validator=self.validator(spec),
                settings=self.settings,
                call_id=f"{self.client_id}-{next(self._numbers)}",
                reply_to=self.client_id,
                timeout=timeout,
                run_id=run_id if run_id is not None else current_run_id(),
                idempotency_key=idempotency_key,
                origin=self._origin,
                caller_beats=self.beating,
                handle=handle,
            )

        call = build(spec)  # a bad call is refused before any I/O
        live = self.catalog.known(spec.name)  # cached; read again in the background when stale
        if live is not None and not self._same_spec(live, spec):
            call = build(live)  # the tool changed since the proxy was made
        record_sent(call.call_id, call.spec.name)
        return call

    def _same_spec(self, live: ToolSpec, spec: ToolSpec) -> bool:
        # Each catalog read makes new spec objects: the last pair found equal is kept per
        # tool, so that calls compare two models once per read, not once per call.
        same = self._equal_specs.get(spec.name)
        if same is not None and same[0] is live and same[1] is spec:
            return True
        if live is spec or live == spec:
            self._equal_specs[spec.name] = (live, spec)
            return True
        return False

    def _send(
        self,
        call: PreparedCall,
        *,
        timeout: float | None,
        batcher: LoopBatcher | None,
        progress: ProgressReceiver | None = None,
        record: dict[str, str] | None = None,
    ) -> tuple[Waiter, CallState | None]:
        """Send ``call``: its future, and its state (None for an outcome this process has stored).

        ``record`` is a submitted call's record (``wire.handles``), written before its
        message goes out; a submitted call is always sent, even when this process has
        its outcome stored (the worker answers it from the store, and ends its record).
        """
        loop = batcher.loop if batcher is not None else None
        key = call.idempotency_key
        if key is not None and record is None and (seen := self.stored.get(key)) is not None:
            # A repeat of a call whose outcome this process has seen stored: no I/O.
            future: Waiter = (
                loop.create_future() if loop is not None else concurrent.futures.Future()
            )
            settle(future, result=seen)
            return future, None
        state = CallState(
            tool=call.spec.name,
            delivery=call.spec.delivery,
            queue=call.spec.queue,
            envelope=call.envelope,
            running_keys=call.running_keys,
            idempotency_key=key,
            pushed=call.envelope,
            fence_ttl_ms=call.claim_ttl_ms or call.sent_ttl_ms,
            run=run_of(call.request.run_id, call.request.reply_to) if self.runlog.on else "",
        )
        future = self.replies.expect(call.call_id, state, loop=loop, progress=progress)
        send = Send(
            call=call,
            future=future,
            state=state,
            expires_at=None if timeout is None else time.monotonic() + timeout,
            record=record,
            record_ttl_ms=self.settings.handle_ttl * 1000,
            made_at=now_ms() if self.runlog.on else None,
        )
        state.resend = lambda: self.publisher.send([send])
        if batcher is not None:
            batcher.add(send)
        else:
            self.publisher.send([send])
        return future, state

    # -- the call: attempts until an outcome counts ------------------------------------

    def attempts(
        self,
        spec: ToolSpec,
        arguments: dict[str, Any],
        options: CallOptions,
        *,
        ends: float | None,
        clock: Callable[[], float],
        batcher: LoopBatcher | None = None,
        progress: ProgressSink | None = None,
        record: Callable[[PreparedCall], dict[str, str]] | None = None,
        watch: AttemptWatch | None = None,
    ) -> Attempts:
        """The one wait loop of every call: start an attempt, yield its future, take its
        outcome (driven by :func:`~agent_client.deadline.drive_sync`,
        :func:`~agent_client.deadline.drive_async` or a
        :class:`~agent_client.deadline.HeldDrive`).

        Another attempt starts only when this caller joined an execution whose own
        caller's deadline passed before it started (nothing ran, the claim is free).
        At the deadline the error says how far the send got: not sent
        (``BrokerUnavailable``), maybe sent (``ToolOutcomeUnknown``), or sent and not
        answered in time (``ToolTimeoutError``).

        A held call (``submit``) gives ``record``, its first attempt's record
        (``wire.handles``, written before its message), and ``watch``, told of each
        attempt sent and of the outcome that counts.
        """
        first = record is not None
        while True:
            left = None if ends is None else max(0.0, ends - clock())
            call = self.prepare(
                spec,
                arguments,
                timeout=left,
                run_id=options.run_id,
                idempotency_key=options.idempotency_key,
                handle=first,
                on_abandon=options.on_abandon,
            )
            future, state = self._send(
                call,
                timeout=left,
                batcher=batcher,
                progress=progress,
                record=record(call) if first and record is not None else None,
            )
            first = False
            if watch is not None:
                watch.sent(call, state)
            if state is None:  # answered from this process's memory of stored outcomes
                self._log(call, SENT, {"tool": call.spec.name, "key": call.idempotency_key})
                self._log(call, JOINED, {"stored": "1"})
            try:
                outcome = yield future
            except ToolTimeoutError as exc:
                stalled = self.publisher.stalled(longer_than=SEND_STALL)
                sent = None if state is None else state.abandon()
                abandoned(self, call.call_id, call.spec, state)
                error = deadline_error(
                    call.spec.name, exc, sent, stalled=stalled, call_id=call.call_id
                )
                self._log(call, TIMEOUT, {"type": type(error).__name__})
                raise error from None
            except RemoteToolError as exc:  # the client's own: lost, not sent, cancelled
                abandoned(self, call.call_id, call.spec, state)
                self._log(call, FAILED, {"type": type(exc).__name__})
                raise
            except BaseException:  # the caller's task cancelled, or the generator closed
                abandoned(self, call.call_id, call.spec, state)
                self._log(call, ABANDONED)
                raise
            finally:
                self.replies.forget(call.call_id)
            if call.idempotency_key is not None:
                # A keyed call's outcome may come from another delivery's run (it joined,
                # or its worker found the outcome stored): only the caller sees its end.
                self._log(call, ANSWERED, {"kind": _kind(outcome)})
            if not joined_an_expired_call(call, outcome):
                if watch is not None:
                    watch.answered(call, outcome)
                return self._result(call, outcome, timeout=options.timeout)

    def _log(
        self, call: PreparedCall, kind: str, fields: dict[str, str | None] | None = None
    ) -> None:
        """Add an event of ``call`` to its run's log (from the caller's thread)."""
        if self.runlog.on:
            request = call.request
            run = run_of(request.run_id, request.reply_to)
            self.runlog.add_soon(run, event(kind, request.call_id, fields))

    async def call(
        self,
        spec: ToolSpec,
        arguments: dict[str, Any],
        options: CallOptions,
        *,
        progress: ProgressSink | None = None,
    ) -> Any:
        """Run a call and return its result, waiting without blocking the event loop.

        Its deadline counts from ``options.started`` when given, else from now.
        """
        loop = asyncio.get_running_loop()
        left = time_left(options.timeout, options.started)
        ends = None if left is None else loop.time() + left
        attempts = self.attempts(
            spec,
            arguments,
            options,
            ends=ends,
            clock=loop.time,
            batcher=self.batcher(),
            progress=progress,
        )
        return await drive_async(
            attempts,
            ends=ends,
            timed_out=lambda: ToolTimeoutError(spec.name, options.timeout or 0.0),
        )

    def call_sync(
        self,
        spec: ToolSpec,
        arguments: dict[str, Any],
        options: CallOptions,
        *,
        progress: ProgressSink | None = None,
    ) -> Any:
        """Run a call and return its result, blocking this thread until the deadline (as
        :meth:`call`)."""
        left = time_left(options.timeout, options.started)
        ends = None if left is None else time.monotonic() + left
        attempts = self.attempts(
            spec, arguments, options, ends=ends, clock=time.monotonic, progress=progress
        )
        return drive_sync(
            attempts,
            ends=ends,
            clock=time.monotonic,
            timed_out=lambda: ToolTimeoutError(spec.name, options.timeout or 0.0),
        )

    def batcher(self) -> LoopBatcher:
        """The batcher of the running event loop (one per loop, made on first use)."""
        loop = asyncio.get_running_loop()
        batcher = self._batchers.get(loop)
        if batcher is None:
            batcher = self._batchers[loop] = LoopBatcher(loop, self.publisher)
        return batcher

    def _result(self, call: PreparedCall, outcome: CallOutcome, *, timeout: float | None) -> Any:
        if call.idempotency_key is not None and should_store(call.spec, outcome):
            self.stored.put(call.idempotency_key, outcome)
        try:
            return result_of(
                call.spec.name, outcome, timeout=timeout, available=self._available(outcome)
            )
        except RemoteToolError as exc:
            exc.call_id = exc.call_id or call.call_id  # every error names its call
            raise

    def _available(self, outcome: CallOutcome) -> list[str]:
        # Only read for a worker's "not found" (a worker without a tool the catalog lists).
        if outcome.error is None or outcome.error.kind is not ErrorKind.NOT_FOUND:
            return []
        return self.catalog.available(read=False)

    def close(self) -> None:
        """Stop the background thread and close the connections; the next call starts them again."""
        self.io.close()

    # -- fork ----------------------------------------------------------------------------

    def _after_fork(self) -> None:
        # The parent's thread is not in this process, and its connections, reply list and
        # waiting calls are the parent's: keep them untouched (referenced, so that nothing
        # closes a socket the parent still uses) and start afresh.
        _inherited.append((self.io, self.replies, self.publisher, self.catalog))
        self._connect()
        self.stored.after_fork()


def joined_an_expired_call(call: PreparedCall, outcome: CallOutcome) -> bool:
    """Whether ``outcome`` is of an execution ``call`` joined that ended unrun: its own
    caller's deadline passed before it started, or its own caller cancelled it. Nothing
    is stored and the claim is free: claim it again for this caller."""
    return (
        outcome.error is not None
        and outcome.error.kind in (ErrorKind.EXPIRED, ErrorKind.CANCELLED)
        and outcome.call_id != call.call_id
    )


_lock = threading.Lock()
_client: ToolClient | None = None
#: Every client of this process, reset in a forked child.
_live: weakref.WeakSet[ToolClient] = weakref.WeakSet()
#: What forked children inherited from their parent's clients, kept from being closed.
_inherited: list[object] = []


def _new_lock_after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # whoever held it in the parent is not in the child


os.register_at_fork(after_in_child=_new_lock_after_fork)
reset_after_fork(_live, ToolClient._after_fork, what="reset a toolexec client")


def configure(settings: Settings | None = None) -> ToolClient:
    """Replace this process's client with one built from ``settings`` (default: env)."""
    global _client
    with _lock:
        old, _client = _client, ToolClient(settings or Settings.from_env())
    if old is not None and old._pid == os.getpid():
        old.close()
    return _client


def get_client() -> ToolClient:
    """This process's client, built from the environment on first use."""
    client = _client
    if client is None:
        return configure()
    if client._pid != os.getpid():  # forked, and the fork hook did not run
        client._after_fork()
    return client


def _kind(outcome: CallOutcome) -> str:
    """An outcome's kind as the run log names it: ``ok`` or its error's kind."""
    if outcome.ok:
        return "ok"
    return outcome.error.kind.value if outcome.error is not None else ErrorKind.EXECUTION.value
