"""One reply listener per process: a single thread resolves every waiting call.

Workers push replies (``<call id>\\n<outcome JSON>``) onto this process's reply list;
the listener pops them (a blocking pop, then a batch drain) and resolves the future
registered under the call id. Callers wait on their future with their own deadline,
so no call holds a thread and no wait is rounded to whole seconds. A reply nobody
waits for any more (the caller timed out) is dropped unparsed.

The same thread watches for lost workers: about once per heartbeat interval it reads
who is running each call that has waited that long (the holder a worker records when
it starts a call) and whether that worker still beats. A call whose worker is gone
is re-sent under the same key (at-least-once) or answered with ``WorkerLost``
(at-most-once), long before its deadline.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import cast

import pydantic
import redis

from agent_client._futures import Waiter, settle_from_thread
from agent_client.errors import BrokerUnavailable
from agent_client.idempotency import release_claim
from executor import keys
from executor.protocol import CallOutcome, Delivery, ErrorKind

__all__ = ["ReplyListener", "Watch"]

logger = logging.getLogger(__name__)

_DRAIN_BATCH = 512
#: Re-sends of one at-least-once call before its caller is told WorkerLost.
_MAX_RESENDS = 3
#: How long Redis may stay unreachable before waiting callers are told.
_OUTAGE_GRACE = 1.0


@dataclass(kw_only=True)
class Watch:
    """What the listener needs to notice that a call's worker died, and act."""

    #: Where workers record who holds the call: the idempotency key's marker first
    #: (set before an idempotent call starts), then the call id's (set by heartbeats).
    running_keys: tuple[str, ...]
    delivery: Delivery
    queue: str
    envelope: str
    since: float
    #: The idempotency key, when this caller claimed one (freed if its worker dies).
    claimed_key: str | None = None
    resent: int = 0


@dataclass
class _Waiting:
    future: Waiter
    watch: Watch | None


class ReplyListener:
    """Resolves call futures from one Redis reply list, and watches for lost workers."""

    def __init__(
        self,
        connect: Callable[[], redis.Redis],
        reply_key: str,
        *,
        check_interval: float,
        broker: redis.Redis | None = None,
    ) -> None:
        self._connect = connect
        self._key = reply_key
        self._check_interval = check_interval
        self._block = min(1.0, check_interval / 2)
        self._broker = broker
        self._pending: dict[str, _Waiting] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def expect(
        self, call_id: str, watch: Watch | None = None, *, loop: asyncio.AbstractEventLoop | None = None
    ) -> Waiter:
        """Register interest in ``call_id``'s outcome; start the listener if needed.

        Returns a future of ``loop`` (call from that loop's thread) or, without a
        loop, a ``concurrent.futures.Future``.
        """
        future: Waiter = loop.create_future() if loop is not None else Future()
        with self._lock:
            self._pending[call_id] = _Waiting(future, watch)
            if self._thread is None or not self._thread.is_alive():
                self._stopping.clear()
                self._thread = threading.Thread(target=self._run, name="toolexec-replies", daemon=True)
                self._thread.start()
        return future

    def forget(self, call_id: str) -> None:
        """Stop waiting for ``call_id``; its outcome, if it comes, is dropped."""
        with self._lock:
            self._pending.pop(call_id, None)

    @property
    def pending(self) -> int:
        """How many calls are waiting."""
        return len(self._pending)

    def stop(self) -> None:
        """Stop the thread (within one blocking-pop period)."""
        self._stopping.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self._block * 2 + 1)

    def _run(self) -> None:
        client = self._connect()
        failing_since: float | None = None
        backoff = 0.05
        next_check = time.monotonic() + self._check_interval
        while not self._stopping.is_set():
            try:
                item = client.blpop([self._key], timeout=self._block)
                failing_since, backoff = None, 0.05
                if item is not None:
                    batch: list[bytes] = [cast(bytes, item[1])]
                    while more := client.lpop(self._key, _DRAIN_BATCH):
                        batch.extend(cast(list[bytes], more))
                    self._resolve(batch)
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + self._check_interval
                    self._check_workers(client)
            except redis.RedisError as exc:
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since >= _OUTAGE_GRACE:
                    self._fail_all(BrokerUnavailable(f"lost the connection to Redis while waiting for replies: {exc}"))
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 0.5)
        client.close()

    def _resolve(self, replies: list[bytes]) -> None:
        settled = []
        for reply in replies:
            call_id, _, body = reply.partition(b"\n")
            with self._lock:
                waiting = self._pending.pop(call_id.decode(), None)
            if waiting is None:
                continue  # abandoned by its caller: dropped without parsing
            try:
                outcome = CallOutcome.model_validate_json(body)
            except pydantic.ValidationError as exc:
                outcome = CallOutcome.failure(
                    call_id.decode(), ErrorKind.EXECUTION, "MalformedReply", f"the worker's reply did not parse: {exc}"
                )
            settled.append((waiting.future, outcome, None))
        settle_from_thread(settled)

    def _check_workers(self, client: redis.Redis) -> None:
        now = time.monotonic()
        with self._lock:
            watched = [
                (call_id, w.watch)
                for call_id, w in self._pending.items()
                if w.watch is not None and now - w.watch.since >= self._check_interval
            ]
        if not watched:
            return
        flat = [key for _, watch in watched for key in watch.running_keys]
        found = iter(cast(list[bytes | None], client.mget(flat)))
        holders = [next((t for t in [next(found) for _ in watch.running_keys] if t), None) for _, watch in watched]
        worker_ids = sorted({h.decode().rpartition("|")[0] for h in holders if h})
        beats = dict(zip(worker_ids, client.mget([keys.worker(w) for w in worker_ids]), strict=True)) if worker_ids else {}
        for (call_id, watch), tag in zip(watched, holders, strict=True):
            if not tag:
                continue
            if beats.get(tag.decode().rpartition("|")[0]) is not None:
                continue
            self._worker_lost(client, call_id, watch)

    def _worker_lost(self, client: redis.Redis, call_id: str, watch: Watch) -> None:
        if watch.delivery == "at_least_once" and watch.resent < _MAX_RESENDS:
            logger.warning("call %s: its worker is gone; sending it again under the same key", call_id)
            (self._broker or client).lpush(watch.queue, watch.envelope)
            watch.resent += 1
            watch.since = time.monotonic()
            return
        logger.warning("call %s: its worker is gone", call_id)
        if watch.claimed_key is not None:
            # Nothing will finish this execution: let a retry in the run claim it again.
            release_claim(client, watch.claimed_key, call_id=call_id)
        with self._lock:
            waiting = self._pending.pop(call_id, None)
        if waiting is not None:
            lost = CallOutcome.failure(
                call_id, ErrorKind.WORKER_LOST, "WorkerLost", "the worker running this call stopped beating"
            )
            settle_from_thread([(waiting.future, lost, None)])

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            waiting = list(self._pending.values())
            self._pending.clear()
        settle_from_thread((entry.future, None, error) for entry in waiting)
