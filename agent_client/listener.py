"""One reply listener per process: a single thread resolves every waiting call.

Workers push outcomes onto this process's reply list; the listener pops them (a
blocking pop, then a batch drain) and resolves the future registered under the call
id. Callers wait on their future with their own deadline, so no call holds a thread
and no wait is rounded to whole seconds. An outcome nobody waits for any more (the
caller timed out) is dropped.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError

import pydantic
import redis

from agent_client.errors import BrokerUnavailable
from executor.protocol import CallOutcome

__all__ = ["ReplyListener"]

logger = logging.getLogger(__name__)

_BLOCK_SECONDS = 1.0
_DRAIN_BATCH = 512
#: How long Redis may stay unreachable before waiting callers are told.
_OUTAGE_GRACE = 1.0


class ReplyListener:
    """Resolves call futures from one Redis reply list."""

    def __init__(self, connect: Callable[[], redis.Redis], reply_key: str) -> None:
        self._connect = connect
        self._key = reply_key
        self._pending: dict[str, Future[CallOutcome]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def expect(self, call_id: str) -> Future[CallOutcome]:
        """Register interest in ``call_id``'s outcome; start the listener if needed."""
        future: Future[CallOutcome] = Future()
        with self._lock:
            self._pending[call_id] = future
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
            thread.join(timeout=_BLOCK_SECONDS * 2 + 1)

    def _run(self) -> None:
        client = self._connect()
        failing_since: float | None = None
        backoff = 0.05
        while not self._stopping.is_set():
            try:
                item = client.blpop([self._key], timeout=_BLOCK_SECONDS)
                failing_since, backoff = None, 0.05
                if item is None:
                    continue
                batch = [item[1]]
                while True:
                    more = client.lpop(self._key, _DRAIN_BATCH)
                    if not more:
                        break
                    batch.extend(more)
                self._resolve(batch)
            except redis.RedisError as exc:
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since >= _OUTAGE_GRACE:
                    self._fail_all(BrokerUnavailable(f"lost the connection to Redis while waiting for replies: {exc}"))
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 0.5)
        client.close()

    def _resolve(self, raw_outcomes: list[bytes]) -> None:
        for raw in raw_outcomes:
            try:
                outcome = CallOutcome.model_validate_json(raw)
            except pydantic.ValidationError:
                logger.warning("dropped a malformed reply")
                continue
            with self._lock:
                future = self._pending.pop(outcome.call_id, None)
            if future is not None:
                with contextlib.suppress(InvalidStateError):  # the caller gave up meanwhile
                    future.set_result(outcome)

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            waiting = list(self._pending.values())
            self._pending.clear()
        for future in waiting:
            with contextlib.suppress(InvalidStateError):
                future.set_exception(error)
