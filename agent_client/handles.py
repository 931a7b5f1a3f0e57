"""Hold a call: submit it, wait for it later or from another process, cancel it.

This module makes a handle (:func:`submit`, :func:`submit_async`: send a call with a
record; :func:`attach`: find one) and is the handle (:class:`CallHandle`).

    handle = search.submit({"query": "tides"}, timeout=600)   # returns once durably queued
    handle.id                                                 # the call id, for later
    hits = await handle.result(timeout=5)                     # this waiter waits 5 s
    handle.status()                                           # "queued", "running", ...
    handle.cancel()                                           # stop it, for real
    again = attach(handle.id)                                 # from any process

A submitted call is an ordinary call with a record (``wire.handles``), written before its
message goes out (``submit`` returns once Redis, or RabbitMQ, confirmed both: the sender
may exit at once and the call still runs) and ended by whoever ends the call: its
worker, a cancel that took it off its queue, or this process for an outcome it received
from another call (one it joined). Any process can :func:`attach` to the record for
``TOOLEXEC_HANDLE_TTL`` seconds after its last change, also after the sender died.

Two clocks end a wait: the waiter's own ``timeout`` (a builtin :class:`TimeoutError`;
the handle stays usable and the call goes on) and the call's deadline
(:class:`~agent_client.errors.ToolTimeoutError`, or the error that says how far its send
got, as for ``invoke``). A tool declared ``@tool(on_abandon="cancel")`` is cancelled when
its deadline passes while it runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any

from agent_client._io import cancels
from agent_client._io.callstate import SEND_STALL, CallState
from agent_client._io.cancels import cancel_call
from agent_client._io.link import NotSent
from agent_client.client import ToolClient, get_client
from agent_client.deadline import HeldDrive, time_left
from agent_client.errors import (
    BrokerUnavailable,
    RemoteToolError,
    ToolTimeoutError,
    deadline_error,
    result_of,
)
from agent_client.options import CallOptions
from agent_client.prepare import PreparedCall
from agent_client.progress import ProgressCallback, ProgressEvent, ProgressSink, ToolResult
from wire import clock as wire_clock
from wire.formats import waiter_entry
from wire.handles import Status, status_of
from wire.models import CallOutcome, ErrorKind, ToolSpec

__all__ = [
    "SUBMIT_PATIENCE",
    "CallHandle",
    "CallNotFound",
    "attach",
    "held",
    "submit",
    "submit_async",
]


class CallNotFound(RemoteToolError):
    """No call with this id is kept: it was never submitted (``invoke`` keeps no record),
    or its record ended more than ``TOOLEXEC_HANDLE_TTL`` seconds ago."""

    def __init__(self, call_id: str) -> None:
        super().__init__(
            f"no submitted call {call_id!r} is kept: it was never submitted with submit(), or its "
            "record expired (TOOLEXEC_HANDLE_TTL)",
            tool="",
        )
        self.call_id = call_id


class CallHandle:
    """A call sent with ``RemoteTool.submit`` or found with :func:`attach`.

    Attributes:
        id: The call's id: give it to :func:`attach` (or ``toolexec cancel``) elsewhere.
        tool: The tool's name.
    """

    def __init__(
        self,
        client: ToolClient,
        *,
        call_id: str,
        tool: str,
        queue: str,
        envelope: str,
        deadline: float | None,
        timeout: float | None,
    ) -> None:
        self.id = call_id
        self.tool = tool
        self._client = client
        self._queue = queue
        self._envelope = envelope
        self._deadline = deadline  # epoch seconds on the shared clock, or None
        self._timeout = timeout
        self._final: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._outcome: CallOutcome | None = None
        self._lock = threading.Lock()
        #: The held call's drive, when this process sent it (None: attached).
        self._drive: HeldDrive | None = None
        self._state: CallState | None = None  # the state of the attempt this process sent
        self._sink: ProgressSink | None = None
        self._streams: list[
            tuple[asyncio.AbstractEventLoop, asyncio.Queue[ProgressEvent | None]]
        ] = []
        self._on_progress: ProgressCallback | None = None
        self._expired = False  # the deadline passed with no outcome

    def __repr__(self) -> str:
        return f"<CallHandle {self.tool} {self.id}>"

    # -- waiting ---------------------------------------------------------------------

    def done(self) -> bool:
        """Whether this process has the call's outcome (or its deadline's error)."""
        return self._final.done()

    def result_sync(self, timeout: float | None = None) -> Any:
        """Block until the call's result; raise its error.

        Raises:
            TimeoutError: ``timeout`` seconds passed first (the call goes on).
            RemoteToolError: The call failed, was cancelled (``ToolCancelled``) or its
                deadline passed (``ToolTimeoutError``).
        """
        waits_until = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if self._expired else self._left()
            deadline = None if left is None else time.monotonic() + left
            ends = _sooner(waits_until, deadline)
            try:
                return self._final.result(
                    None if ends is None else max(0.0, ends - time.monotonic())
                )
            except concurrent.futures.TimeoutError:
                if deadline is not None and ends == deadline:  # the call's deadline came first
                    self._expire()
                    continue
                raise TimeoutError(f"call {self.id} of {self.tool!r} has not ended yet") from None

    async def result(self, timeout: float | None = None) -> Any:
        """Wait for the call's result without blocking the event loop; raise its error.

        Raises:
            TimeoutError: ``timeout`` seconds passed first (the call goes on).
            RemoteToolError: As :meth:`result_sync`.
        """
        loop = asyncio.get_running_loop()
        waits_until = None if timeout is None else loop.time() + timeout
        while True:
            if self._final.done():
                return self._final.result()
            left = None if self._expired else self._left()
            deadline = None if left is None else loop.time() + left
            ends = _sooner(waits_until, deadline)
            try:
                async with asyncio.timeout_at(ends):
                    return await asyncio.shield(asyncio.wrap_future(self._final))
            except TimeoutError:
                if deadline is not None and ends == deadline:  # the call's deadline came first
                    self._expire()
                    continue
                raise TimeoutError(f"call {self.id} of {self.tool!r} has not ended yet") from None

    async def stream(self) -> AsyncIterator[ProgressEvent | ToolResult]:
        """Yield the progress the tool reports from now on, then one ``ToolResult``.

        Only the process that submitted the call receives its progress; an attached
        handle yields its result alone. A failed call raises after its progress.
        """
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[ProgressEvent | None] = asyncio.Queue()
        with self._lock:
            self._streams.append((loop, events))
        self._final.add_done_callback(lambda _: _put(loop, events, None))
        try:
            while (event := await events.get()) is not None:
                yield event
            yield ToolResult(await self.result())
        finally:
            with self._lock:
                self._streams = [s for s in self._streams if s[1] is not events]

    # -- asking ------------------------------------------------------------------------

    def status(self) -> Status:
        """Where the call is: ``queued``, ``running``, ``done``, ``failed``, ``cancelled``,
        ``expired`` or ``unknown`` (nothing is kept of it). One Redis read.

        Raises:
            BrokerUnavailable: Redis did not answer.
        """
        return self._status(self._client.io.run(self._read_status, timeout=cancels.TIMEOUT + 1))

    async def status_async(self) -> Status:
        """:meth:`status` without blocking the event loop."""
        return self._status(
            await self._client.io.run_async(self._read_status, timeout=cancels.TIMEOUT + 1)
        )

    async def _read_status(self) -> str:
        store = self._client.io.link(self._client.settings.redis_url, "read")
        try:
            record = await cancels.read_record(store, self.id)
        except NotSent as exc:
            raise BrokerUnavailable(
                f"cannot read the status of call {self.id}: {exc}", tool=self.tool
            ) from None
        return record.get("status", "unknown")

    def _status(self, kept: str) -> Status:
        outcome = self._outcome
        if outcome is not None:
            return status_of(outcome.ok, outcome.error.kind.value if outcome.error else None)
        if kept in ("queued", "running") and self._deadline_passed():
            return "expired"
        if kept in ("queued", "running", "done", "failed", "cancelled", "expired"):
            return kept  # type: ignore[return-value]
        return "unknown"

    # -- cancelling --------------------------------------------------------------------

    def cancel(self) -> bool:
        """Cancel the call: a queued one never starts, a running one is stopped (its tool
        gets its ``cancel_grace``). Returns False if it had ended already.

        Waiters get ``ToolCancelled`` once the call has stopped.

        Raises:
            BrokerUnavailable: The cancel did not reach Redis (nothing was cancelled).
        """
        if self._final.done():
            return False
        return self._client.io.run(self._cancel, timeout=2 * cancels.TIMEOUT + 1)

    async def cancel_async(self) -> bool:
        """:meth:`cancel` without blocking the event loop."""
        if self._final.done():
            return False
        return await self._client.io.run_async(self._cancel, timeout=2 * cancels.TIMEOUT + 1)

    async def _cancel(self) -> bool:
        client = self._client
        return await cancel_call(
            client,
            self.id,
            tool=self.tool,
            queue=self._queue,
            envelope=self._envelope,
            generations=client.settings.max_deliveries,
        )

    # -- the call's end, in this process -------------------------------------------------

    def _left(self) -> float | None:
        return None if self._deadline is None else self._deadline - wire_clock.shared_now()

    def _deadline_passed(self) -> bool:
        left = self._left()
        return left is not None and left <= 0

    # As the watch of the held call's attempts (agent_client.client.AttemptWatch):

    def sent(self, call: PreparedCall, state: CallState | None) -> None:
        """An attempt of this call was sent (the first one is the handle's own)."""
        with self._lock:
            self._state = state

    def answered(self, call: PreparedCall, outcome: CallOutcome) -> None:
        """The outcome that ends the call arrived, for the attempt ``call``."""
        with self._lock:
            self._outcome = outcome
        lost = outcome.error is not None and outcome.error.kind is ErrorKind.WORKER_LOST
        if outcome.call_id != self.id or lost:
            # Joined, answered from the store, or given up by this client's watchdog: no
            # worker ended this call's record (a second end changes nothing).
            self._end_record(outcome)

    def _ended(self, outcome: CallOutcome) -> None:
        """An attached call's outcome reached this process (on the I/O thread, or at attach)."""
        with self._lock:
            if self._final.done():
                return
            self._outcome = outcome
        try:
            value = result_of(self.tool, outcome, timeout=self._timeout)
        except RemoteToolError as exc:
            exc.call_id = exc.call_id or self.id
            self._finish(error=exc)
        else:
            self._finish(value=value)

    def _expire(self) -> None:
        """The call's deadline passed with no outcome: end it as ``invoke`` would."""
        with self._lock:
            if self._final.done() or self._expired:
                return
            self._expired = True  # its error is on its way to the waiters
        if self._drive is not None:
            self._drive.expire()  # the attempts loop says how far the send got
            return
        timed_out = ToolTimeoutError(self.tool, self._timeout or 0.0)
        timed_out.call_id = self.id
        self._finish(error=timed_out)

    def _end_record(self, outcome: CallOutcome) -> None:
        settings = self._client.settings
        store = self._client.io.link(settings.redis_url, "read")

        async def end() -> None:
            try:
                await cancels.end(
                    store,
                    outcome.model_copy(update={"call_id": self.id}),
                    handle_ttl=settings.handle_ttl,
                    reply_ttl=settings.reply_ttl,
                    tell_sender=False,
                )
            except NotSent:
                pass  # attached processes wait for the deadline instead

        self._client.io.submit(end)

    def _progress(self, event: ProgressEvent) -> object:
        # The sink's callback: the caller's own, then every open stream().
        with self._lock:
            streams = list(self._streams)
        for loop, events in streams:
            _put(loop, events, event)
        callback = self._on_progress
        return callback(event) if callback is not None else None

    def _finish(self, *, value: Any = None, error: BaseException | None = None) -> None:
        # Settled after the progress received before the end has been handed over.
        sink, self._sink = self._sink, None
        if sink is None:
            _set(self._final, value=value, error=error)
        else:
            sink.then(lambda: _set(self._final, value=value, error=error))


# -- making a handle: send a call with a record, or find one -----------------------


#: How long a submit without a deadline waits for Redis (or RabbitMQ) to confirm its call.
SUBMIT_PATIENCE = 30.0


def submit(
    client: ToolClient,
    spec: ToolSpec,
    arguments: dict[str, Any],
    options: CallOptions,
    *,
    on_progress: ProgressCallback | None = None,
) -> CallHandle:
    """Send a call with a record; return its handle once both are durably queued
    (``RemoteTool.submit``).

    Raises:
        BrokerUnavailable: Nothing of the call was confirmed by its deadline (or within
            :data:`SUBMIT_PATIENCE` without one), and it provably was not sent.
        ToolOutcomeUnknown: A write of it may have reached Redis, unconfirmed.
        ToolTimeoutError: Redis answered, but the deadline was shorter than the way there.
    """
    handle, queued, patience = _send(client, spec, arguments, options, on_progress=on_progress)
    try:
        queued.result(patience)
    except concurrent.futures.TimeoutError:
        error = _not_queued(client, handle, patience)
        if error is not None:
            raise error from None
    return handle


async def submit_async(
    client: ToolClient,
    spec: ToolSpec,
    arguments: dict[str, Any],
    options: CallOptions,
    *,
    on_progress: ProgressCallback | None = None,
) -> CallHandle:
    """:func:`submit` that awaits the confirmation without blocking the event loop."""
    handle, queued, patience = _send(client, spec, arguments, options, on_progress=on_progress)
    # Shielded: the confirmation's future is the I/O thread's, and a wait that ends must
    # not cancel it.
    done, _ = await asyncio.wait({asyncio.shield(asyncio.wrap_future(queued))}, timeout=patience)
    error = None if done else _not_queued(client, handle, patience)
    if error is not None:
        raise error
    return handle


def _not_queued(client: ToolClient, handle: CallHandle, patience: float) -> RemoteToolError | None:
    """The error of a submit not confirmed within ``patience`` (the call is given up, as
    ``invoke`` gives one up at its deadline: :func:`~agent_client.errors.deadline_error`),
    or None when the confirmation came as the wait ended (the call is queued after all)."""
    state = handle._state
    if state is None or state.queued.done():
        return None
    sent = state.abandon()
    if sent[0]:
        return None  # confirmed in the instant between the two looks
    held(client).pop(handle.id, None)
    if handle._drive is not None:
        handle._drive.close()  # given up: the attempts loop forgets it
    return deadline_error(
        handle.tool,
        ToolTimeoutError(handle.tool, patience),
        sent,
        stalled=client.publisher.stalled(longer_than=SEND_STALL),
        call_id=handle.id,
    )


def _send(
    client: ToolClient,
    spec: ToolSpec,
    arguments: dict[str, Any],
    options: CallOptions,
    *,
    on_progress: ProgressCallback | None,
) -> tuple[CallHandle, concurrent.futures.Future[None], float]:
    """Start a held call: the client's one attempts loop, its first attempt with a
    record, driven by callbacks. Returns its handle, the future its first confirmation
    resolves, and how long to wait for it."""
    left = time_left(options.timeout, options.started)
    ends = None if left is None else time.monotonic() + left
    # Its id, queue, envelope and deadline are its first attempt's (``record``, below).
    handle = CallHandle(
        client,
        call_id="",
        tool=spec.name,
        queue="",
        envelope="",
        deadline=None,
        timeout=options.timeout,
    )
    handle._on_progress = on_progress
    sink = handle._sink = ProgressSink(handle._progress, None)

    def record(call: PreparedCall) -> dict[str, str]:
        # The first attempt is the handle's: its id, queue and envelope are the record's.
        handle.id, handle._queue, handle._envelope = call.call_id, call.spec.queue, call.envelope
        handle._deadline = call.request.deadline
        held(client)[call.call_id] = handle
        return {
            "tool": call.spec.name,
            "queue": call.spec.queue,
            "envelope": call.envelope,
            "status": "queued",
            "deadline": "" if call.request.deadline is None else repr(call.request.deadline),
            "sender": waiter_entry(client.client_id, call.call_id),
            "run_id": call.request.run_id or "",
            "timeout": "" if options.timeout is None else repr(options.timeout),
            "submitted_at": f"{time.time():.3f}",
        }

    attempts = client.attempts(
        spec,
        arguments,
        options,
        ends=ends,
        clock=time.monotonic,
        progress=sink,
        record=record,
        watch=handle,
    )
    handle._drive = HeldDrive(
        attempts,
        ends=ends,
        clock=time.monotonic,
        timed_out=lambda: ToolTimeoutError(spec.name, options.timeout or 0.0),
        ended=lambda value, error: handle._finish(value=value, error=error),
    )
    handle._drive.start()  # prepares (a bad call raises here) and sends the first attempt
    state = handle._state
    assert state is not None  # a call with a record is always sent (ToolClient._send)
    if ends is not None:
        client.io.call_soon(lambda: client.io.loop.call_at(ends, handle._expire))
    return handle, state.queued, SUBMIT_PATIENCE if left is None else max(0.0, left)


def attach(call_id: str, *, client: ToolClient | None = None) -> CallHandle:
    """The handle of a call that any process submitted, also one whose sender died.

    Raises:
        CallNotFound: No such call is kept (never submitted, or its record expired).
        BrokerUnavailable: Redis did not answer.
    """
    client = client or get_client()
    mine = held(client).get(call_id)
    if mine is not None:
        return mine  # this process holds it already: one waiter per call id
    future = client.replies.expect(call_id)
    try:
        record, (state, value) = client.io.run(
            lambda: join_record(client, call_id), timeout=2 * cancels.TIMEOUT + 1
        )
    except BaseException:
        client.replies.forget(call_id)
        raise
    if state == "unknown":
        client.replies.forget(call_id)
        raise CallNotFound(call_id)
    deadline = float(record["deadline"]) if record.get("deadline") else None
    timeout = float(record["timeout"]) if record.get("timeout") else None
    handle = CallHandle(
        client,
        call_id=call_id,
        tool=record.get("tool", ""),
        queue=record.get("queue", ""),
        envelope=record.get("envelope", ""),
        deadline=deadline,
        timeout=timeout,
    )
    held(client)[call_id] = handle
    if state == "ended":
        client.replies.forget(call_id)
        handle._ended(CallOutcome.model_validate_json(value))
        return handle

    def arrived(done: concurrent.futures.Future[CallOutcome]) -> None:
        if not done.cancelled() and done.exception() is None:
            handle._ended(done.result())

    future.add_done_callback(arrived)  # type: ignore[arg-type]
    left = handle._left()
    if left is not None:

        def expire() -> None:
            client.replies.forget(call_id)
            handle._expire()

        client.io.call_soon(lambda: client.io.loop.call_later(max(0.0, left), expire))
    return handle


async def join_record(client: ToolClient, call_id: str) -> tuple[dict[str, str], tuple[str, str]]:
    settings = client.settings
    store = client.io.link(settings.redis_url, "read")
    try:
        record = await cancels.read_record(store, call_id)
        joined = await cancels.join(
            store, call_id=call_id, client_id=client.client_id, ttl_ms=settings.handle_ttl * 1000
        )
    except NotSent as exc:
        raise BrokerUnavailable(f"cannot attach to call {call_id}: {exc}", tool="") from None
    return record, joined


#: Each client's handles still referenced, by call id.
_handles: weakref.WeakKeyDictionary[ToolClient, weakref.WeakValueDictionary[str, CallHandle]] = (
    weakref.WeakKeyDictionary()
)


def held(client: ToolClient) -> weakref.WeakValueDictionary[str, CallHandle]:
    """The handles of ``client`` that are still referenced, by call id (one per call)."""
    kept = _handles.get(client)
    if kept is None:
        kept = _handles[client] = weakref.WeakValueDictionary()
    return kept


def _sooner(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def _set(
    future: concurrent.futures.Future[Any], *, value: Any = None, error: BaseException | None = None
) -> None:
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)
    except concurrent.futures.InvalidStateError:
        pass  # set already: the first end wins


def _put(
    loop: asyncio.AbstractEventLoop,
    events: asyncio.Queue[ProgressEvent | None],
    item: ProgressEvent | None,
) -> None:
    try:
        loop.call_soon_threadsafe(events.put_nowait, item)
    except RuntimeError:
        pass  # that loop is closed: nobody reads the stream
