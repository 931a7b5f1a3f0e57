"""The process's connection to toolexec: dispatch a call, wait for its outcome.

One :class:`ToolClient` per process (:func:`get_client`) holds the Redis connection
pool, the catalog view and the reply listener. ``call`` (async) and ``call_sync`` share
one path: validate, build the message, publish it, then wait on a future with the
caller's own deadline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import os
import threading
import time
import uuid
import weakref
from collections.abc import Iterable
from typing import Any, cast

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from agent_client._futures import Waiter, settle
from agent_client.catalog import Catalog
from agent_client.errors import (
    RemoteToolError,
    ToolArgumentsInvalid,
    ToolExecutionError,
    ToolNotFound,
    ToolTimeoutError,
    WorkerLost,
)
from agent_client.idempotency import idempotency_key as key_for
from agent_client.listener import ReplyListener, Watch
from agent_client.publish import LoopBatcher, Publisher, Send
from agent_client.scope import current_run_id
from agent_client.stored import StoredOutcomes
from agent_client.validation import ArgumentValidator
from executor import keys
from executor.message import redis_envelope, task_headers
from executor.protocol import CallOutcome, CallRequest, ErrorKind, ToolSpec, should_store, task_name_for
from executor.settings import Settings

__all__ = ["ToolClient", "configure", "get_client"]

#: Celery's hard limit sits this far above a tool's own, so the tool's limit fires
#: first and Celery's only reclaims a prefork child stuck in a thread that won't stop.
_CELERY_LIMIT_MARGIN = 1.0


class ToolClient:
    """Dispatches calls to workers and waits for their outcomes."""

    def __init__(self, settings: Settings) -> None:
        if not settings.broker_url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(
                f"toolexec's client publishes to a Redis broker; TOOLEXEC_BROKER_URL is "
                f"{settings.broker_url.split('://')[0]}://..."
            )
        self.settings = settings
        self.client_id = uuid.uuid4().hex
        self._pid = os.getpid()
        self._broker = self._redis(settings.broker_url)
        self.redis = self._broker if settings.redis_url == settings.broker_url else self._redis(settings.redis_url)
        self.catalog = Catalog(self.redis, max_age=min(1.0, settings.heartbeat_interval / 2))
        self.listener = ReplyListener(
            lambda: self._redis(settings.redis_url, blocking=True),
            keys.reply(self.client_id),
            check_interval=settings.heartbeat_interval,
            broker=self._broker,
        )
        self._validators: dict[str, tuple[ToolSpec, ArgumentValidator]] = {}
        self.publisher = Publisher(self._broker, self.redis, reply_to=self.client_id)
        self._batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopBatcher] = weakref.WeakKeyDictionary()
        self._numbers = itertools.count(1)
        self.stored = StoredOutcomes(ttl=settings.outcome_ttl)
        self._origin = f"toolexec-client@{os.getpid()}"

    @staticmethod
    def _redis(url: str, *, blocking: bool = False) -> redis.Redis:
        # No automatic retries: an outage must surface as BrokerUnavailable within the
        # caller's deadline, not hide behind backoff.
        return redis.Redis.from_url(
            url,
            socket_connect_timeout=2.0,
            socket_timeout=5.0 if blocking else 2.0,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )

    # -- the call path -------------------------------------------------------------

    def validate(self, spec: ToolSpec, arguments: dict[str, Any]) -> None:
        """Check ``arguments`` against ``spec``'s schema (validator compiled once)."""
        cached = self._validators.get(spec.name)
        if cached is None or cached[0] != spec:
            cached = (spec, ArgumentValidator(spec.name, spec.parameters, max_bytes=self.settings.max_argument_bytes))
            self._validators[spec.name] = cached
        cached[1].check(arguments)

    def start(
        self,
        spec: ToolSpec,
        arguments: dict[str, Any],
        *,
        timeout: float | None,
        run_id: str | None = None,
        idempotency_key: str | None = None,
        batcher: LoopBatcher | None = None,
    ) -> tuple[CallRequest, Waiter]:
        """Validate and send one call; return it and the future of its outcome.

        For an idempotent tool the send is a claim: a stored outcome resolves the
        future at once, and a call already under way in the run is joined. With a
        ``batcher`` the send waits for the end of the event loop's turn.
        """
        self.validate(spec, arguments)
        self.catalog.spec(spec.name)  # ToolNotFound if no live worker serves it
        if spec.idempotent and idempotency_key is None:
            run = run_id or current_run_id() or uuid.uuid4().hex  # outside a scope: a run of its own
            idempotency_key = key_for(run, spec.name, spec.parameters, arguments)
            run_id = run
        elif run_id is None:
            run_id = current_run_id()
        call = CallRequest.model_construct(  # fields built here are valid by construction
            call_id=f"{self.client_id}-{next(self._numbers)}",
            tool=spec.name,
            arguments=arguments,
            reply_to=self.client_id,
            deadline=None if timeout is None else time.time() + timeout,
            run_id=run_id,
            idempotency_key=idempotency_key,
        )
        if idempotency_key is not None and (seen := self.stored.get(idempotency_key)) is not None:
            # A repeat of a call whose outcome this process has seen stored: no I/O.
            future: Waiter = batcher.loop.create_future() if batcher is not None else concurrent.futures.Future()
            settle(future, result=seen)
            return call, future
        hard = spec.hard_timeout + _CELERY_LIMIT_MARGIN if spec.hard_timeout else None
        headers = task_headers(call, task_name=task_name_for(spec.delivery), hard_limit=hard, origin=self._origin)
        envelope = redis_envelope(call, queue=spec.queue, headers=headers)
        watch = Watch(
            running_keys=(
                (keys.running(idempotency_key), keys.running(call.call_id))
                if idempotency_key
                else (keys.running(call.call_id),)
            ),
            delivery=spec.delivery,
            queue=spec.queue,
            envelope=envelope,
            since=time.monotonic(),
            claimed_key=idempotency_key,
        )
        future = self.listener.expect(call.call_id, watch, loop=batcher.loop if batcher is not None else None)
        claim = None
        if idempotency_key is not None:
            window = timeout if timeout is not None else self.settings.outcome_ttl
            claim = (idempotency_key, int((window + (spec.hard_timeout or 0) + self.settings.claim_margin) * 1000))
        send = Send(tool=spec.name, call_id=call.call_id, queue=spec.queue, envelope=envelope, future=future, claim=claim)
        if batcher is not None:
            batcher.add(send)
        else:
            self.publisher.send([send])
        return call, future

    def batcher(self) -> LoopBatcher:
        """The batcher of the running event loop (one per loop, made on first use)."""
        loop = asyncio.get_running_loop()
        batcher = self._batchers.get(loop)
        if batcher is None:
            batcher = self._batchers[loop] = LoopBatcher(loop, self.publisher)
        return batcher

    async def call(self, spec: ToolSpec, arguments: dict[str, Any], *, timeout: float | None, **options: Any) -> Any:
        """Run a call and return its result, waiting without blocking the event loop."""
        loop = asyncio.get_running_loop()
        batcher = self.batcher()
        ends = None if timeout is None else loop.time() + timeout
        while True:
            left = None if ends is None else max(0.0, ends - loop.time())
            call, future = self.start(spec, arguments, timeout=left, batcher=batcher, **options)
            # The loop's own timer ends the wait: exact, and no task or thread per call.
            expiry = None if ends is None else loop.call_at(ends, _expire, future)
            try:
                outcome = await cast("asyncio.Future[CallOutcome]", future)
            except _DeadlinePassed:
                raise ToolTimeoutError(spec.name, timeout or 0.0) from None
            finally:
                if expiry is not None:
                    expiry.cancel()
                self.listener.forget(call.call_id)
            if not _joined_an_expired_call(call, outcome):
                return self._result(spec, call, outcome, timeout=timeout)

    def call_sync(self, spec: ToolSpec, arguments: dict[str, Any], *, timeout: float | None, **options: Any) -> Any:
        """Run a call and return its result, blocking this thread until the deadline."""
        ends = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if ends is None else max(0.0, ends - time.monotonic())
            call, future = self.start(spec, arguments, timeout=left, **options)
            try:
                outcome = cast("concurrent.futures.Future[CallOutcome]", future).result(left)
            except concurrent.futures.TimeoutError:
                raise ToolTimeoutError(spec.name, timeout or 0.0) from None
            finally:
                self.listener.forget(call.call_id)
            if not _joined_an_expired_call(call, outcome):
                return self._result(spec, call, outcome, timeout=timeout)

    def _result(self, spec: ToolSpec, call: CallRequest, outcome: CallOutcome, *, timeout: float | None) -> Any:
        if call.idempotency_key is not None and should_store(spec, outcome):
            self.stored.put(call.idempotency_key, outcome)
        return result_of(spec.name, outcome, timeout=timeout, available=self._available(outcome))

    def _available(self, outcome: CallOutcome) -> list[str]:
        # Only read for a worker's "not found" (a worker without a tool the catalog lists).
        if outcome.error is None or outcome.error.kind is not ErrorKind.NOT_FOUND:
            return []
        self.catalog.invalidate()
        return self.catalog.available()

    def close(self) -> None:
        """Stop the listener and close the connection pools."""
        self.listener.stop()
        self._broker.close()
        if self.redis is not self._broker:
            self.redis.close()


class _DeadlinePassed(Exception):
    pass


def _expire(future: Waiter) -> None:
    settle(future, error=_DeadlinePassed())


def _joined_an_expired_call(call: CallRequest, outcome: CallOutcome) -> bool:
    # This caller joined an execution whose own caller's deadline passed before it
    # started: nothing ran and the claim is free, so claim it again for this caller.
    return (
        outcome.error is not None
        and outcome.error.kind is ErrorKind.EXPIRED
        and outcome.call_id != call.call_id
    )


def result_of(tool: str, outcome: CallOutcome, *, timeout: float | None = None, available: Iterable[str] = ()) -> Any:
    """The outcome's result, or the error it carries raised as a :class:`RemoteToolError`."""
    if outcome.ok:
        return outcome.result
    error = outcome.error
    if error is None:
        raise RemoteToolError(f"tool {tool!r} failed without an error description", tool=tool)
    if error.kind is ErrorKind.INVALID_ARGUMENTS:
        raise ToolArgumentsInvalid(tool, [error.message])
    if error.kind is ErrorKind.NOT_FOUND:
        raise ToolNotFound(tool, available, reason=error.message)
    if error.kind is ErrorKind.WORKER_LOST:
        raise WorkerLost(f"tool {tool!r}: {error.message}", tool=tool)
    if error.kind is ErrorKind.EXPIRED:
        raise ToolTimeoutError(tool, timeout or 0.0)
    raise ToolExecutionError(tool, error.type, error.message)


_lock = threading.Lock()
_client: ToolClient | None = None


def configure(settings: Settings | None = None) -> ToolClient:
    """Replace this process's client with one built from ``settings`` (default: env)."""
    global _client
    with _lock:
        old, _client = _client, ToolClient(settings or Settings.from_env())
    if old is not None and old._pid == os.getpid():
        old.close()
    return _client


def get_client() -> ToolClient:
    """This process's client, built from the environment on first use (again after fork)."""
    client = _client
    if client is None or client._pid != os.getpid():
        return configure(None if client is None else client.settings)
    return client
