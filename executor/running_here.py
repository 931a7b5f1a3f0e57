"""The idempotency keys this worker process is running, and the call a delivery must run.

:func:`executor.task.admit` begins a keyed call through :data:`running_here`, which
makes a second delivery of a key that runs in this same process join it rather than
run it again (the threads and asyncio pools run several deliveries per process).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

import redis

from executor.idempotency import begin
from executor.registry import ToolDefinition
from wire.formats import joining_tag
from wire.models import CallRequest
from wire.scripts import BeginState

__all__ = ["Admitted", "RunningHere", "running_here"]


@dataclass(frozen=True, slots=True)
class Admitted:
    """A call this delivery must run: it is valid, unexpired and begun (:func:`admit`)."""

    call: CallRequest
    definition: ToolDefinition | None
    holder: str
    #: For a keyed call: its lock in :data:`running_here`, held again to complete it.
    key_lock: threading.Lock | None = None


class RunningHere:
    """The idempotency keys deliveries of this process are running.

    The begin script takes a key's state holding this process's own tag for a stale
    one and runs the call again: a prefork or solo process runs one call at a time, so
    its own holder tag is left from a delivery that ended. On the threads and asyncio pools
    another delivery of this process may still be running the key. A delivery of a key
    that runs here therefore begins under this process's joining tag
    (:func:`wire.formats.joining_tag`: the script sees a live holder and adds it as a
    waiter); each key's begin and complete hold its lock, so such a join never falls
    between the two.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[str, threading.Lock] = {}

    def begin(
        self, client: redis.Redis, call: CallRequest, key: str, *, tag: str, worker: str, ttl_ms: int,
        patience: float,
    ) -> tuple[BeginState, str, str, threading.Lock | None]:
        """:func:`begin` for a keyed call: (state, value, holder it began as, key lock if it runs)."""
        while True:
            with self._lock:
                lock = self._keys.get(key)
                first = lock is None
                if lock is None:
                    lock = self._keys[key] = threading.Lock()
                    lock.acquire()
            if first:
                try:
                    state, value = begin(
                        client, call, holder=tag, hostname=worker, ttl_ms=ttl_ms, patience=patience
                    )
                except BaseException:
                    self._end(key, lock)
                    raise
                if state != "run":
                    self._end(key, lock)
                    return state, value, tag, None
                lock.release()  # held again by complete (Admitted.key_lock)
                return state, value, tag, lock
            with lock:  # no begin or complete of the running delivery is under way
                if self._keys.get(key) is lock:
                    joiner = joining_tag(tag)
                    state, value = begin(
                        client, call, holder=joiner, hostname=worker, ttl_ms=ttl_ms, patience=patience
                    )
                    return state, value, joiner, None
            # The delivery running it here has ended meanwhile: begin afresh.

    def complete(self, admitted: Admitted, deliver: functools.partial[None]) -> None:
        """Run ``deliver`` (the complete step) under the key's lock, then forget the key."""
        lock, key = admitted.key_lock, admitted.call.idempotency_key
        if lock is None or key is None:
            deliver()
            return
        lock.acquire()
        try:
            deliver()
        finally:
            self._end(key, lock)

    def abandon(self, admitted: Admitted) -> None:
        """Forget the key of a delivery that ends without completing (its process stops)."""
        if admitted.key_lock is not None and admitted.call.idempotency_key is not None:
            admitted.key_lock.acquire()
            self._end(admitted.call.idempotency_key, admitted.key_lock)

    def _end(self, key: str, lock: threading.Lock) -> None:
        with self._lock:
            if self._keys.get(key) is lock:
                del self._keys[key]
        lock.release()


#: The keys this process runs.
running_here = RunningHere()
