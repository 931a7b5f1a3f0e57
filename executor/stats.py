"""Per-tool call counts over the last minute and hour, for ``toolexec status``.

Each worker process counts the outcomes it delivers in memory (:func:`record`: no I/O,
one lock) and adds them to time-bucketed Redis hashes (:func:`wire.keys.stats`) at most
about once a second, so counting adds no round trip to a call:

* in the worker's main process (solo, threads and asyncio pools, and the outcomes the
  main process delivers for a prefork child that died) the heartbeat drains the counts
  into the pipeline it sends anyway (:func:`flush_into`);
* each prefork pool child flushes its own from a daemon thread, every
  :data:`FLUSH_INTERVAL` seconds while it has counts, and once more as it exits
  (:func:`flush_now`, at Celery's ``worker_process_shutdown``, connected by
  :mod:`executor.seams.app`: a child retired after a runaway tool, or stopped with its
  worker).

Counts live in two sets of buckets, keyed by the bucket's start on Redis' clock
(:func:`wire.clock.shared_now`, so workers on hosts whose clocks differ agree):
10-second buckets for the last minute and minute buckets for the last hour, each
expiring a while after the window that reads it. :func:`read_counts` sums the buckets
that overlap a window, so "the last minute" covers 60 to 70 seconds and "the last hour"
60 to 61 minutes. Counts a process holds when it dies (at most the last second's) are
lost; the figures are for operators, not for billing.

The field of a count is ``<kind>:<tool>``: ``ok`` or an :class:`~wire.models.ErrorKind`
value. :data:`CATEGORY` folds the kinds into what ``status`` shows: done, failed and
timed out (the deadline passed before the call started, or the tool ran past its
hard limit). Beside them, ``retry:<tool>`` counts the attempts that retried a call
(:func:`record_retry`, ``@tool(retries=...)``): runs, not outcomes.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

import redis

from executor.worker import in_pool_child, redis_client_for_url
from wire import keys
from wire.clock import shared_now
from wire.models import CallOutcome, ErrorKind

__all__ = [
    "BUCKETS",
    "CATEGORY",
    "FLUSH_INTERVAL",
    "RETRY",
    "WINDOWS",
    "Category",
    "ToolCounts",
    "flush_into",
    "flush_now",
    "pending",
    "read_counts",
    "record",
    "record_retry",
]

#: Seconds between two flushes of a prefork child's counts.
FLUSH_INTERVAL = 1.0

#: Bucket width in seconds -> TTL of each bucket of that width, in seconds.
BUCKETS: dict[int, int] = {10: 180, 60: 3600 + 600}

#: Window name -> (its length in seconds, the width of the buckets it is read from).
WINDOWS: dict[str, tuple[int, int]] = {"last_minute": (60, 10), "last_hour": (3600, 60)}

#: Buckets a process keeps unflushed at most (a process nothing flushes keeps the newest).
_MAX_PENDING_BUCKETS = 512

Category = Literal["done", "failed", "timed_out"]

#: The kind of the field that counts retries: attempts, not outcomes (:func:`record_retry`).
RETRY = "retry"

#: Outcome kind -> what ``toolexec status`` counts it as.
CATEGORY: dict[str, Category] = {
    "ok": "done",
    ErrorKind.EXECUTION.value: "failed",
    ErrorKind.INVALID_ARGUMENTS.value: "failed",
    ErrorKind.NOT_FOUND.value: "failed",
    ErrorKind.WORKER_LOST.value: "failed",
    ErrorKind.CANCELLED.value: "failed",  # not done; by_kind tells a cancel from a failure
    ErrorKind.EXPIRED.value: "timed_out",
    ErrorKind.HARD_TIMEOUT.value: "timed_out",
}


class _Counts:
    """This process's counts not yet in Redis: bucket key -> field -> calls."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending: dict[str, Counter[str]] = {}
        self.redis_url = ""
        self.sentinel_master: str | None = None
        self.flusher: threading.Thread | None = None

    def take(self) -> dict[str, Counter[str]]:
        with self.lock:
            taken, self.pending = self.pending, {}
        return taken


_counts = _Counts()


def _forget_after_fork() -> None:
    # A forked pool child starts with no counts: its parent's are its parent's to flush.
    global _counts
    _counts = _Counts()


os.register_at_fork(after_in_child=_forget_after_fork)


def _kind(outcome: CallOutcome) -> str:
    if outcome.ok:
        return "ok"
    return outcome.error.kind.value if outcome.error is not None else ErrorKind.EXECUTION.value


def record(
    tool: str,
    outcome: CallOutcome,
    *,
    redis_url: str,
    sentinel_master: str | None = None,
    now: float | None = None,
) -> None:
    """Count one delivered outcome of ``tool``; no I/O (a prefork child's thread flushes it).

    Args:
        tool: The tool called.
        outcome: What its caller was sent.
        redis_url: Where a prefork child flushes its counts (``settings.redis_url``).
        sentinel_master: The group a ``sentinel://`` ``redis_url`` names.
        now: Epoch seconds on Redis' clock; :func:`wire.clock.shared_now` when omitted.
    """
    counts = _counts
    with counts.lock:
        _count(counts, f"{_kind(outcome)}:{tool}", shared_now() if now is None else now)
        counts.redis_url, counts.sentinel_master = redis_url, sentinel_master
        flusher = None
        if counts.flusher is None and in_pool_child():
            flusher = counts.flusher = threading.Thread(
                target=_flush_forever, args=(counts,), name="toolexec-stats", daemon=True
            )
    if flusher is not None:
        flusher.start()  # a prefork child's: it flushes every second


def record_retry(tool: str, *, now: float | None = None) -> None:
    """Count an attempt that retries a call of ``tool``; no I/O. It is flushed with the
    call's outcome, which :func:`record` counts when it is delivered."""
    counts = _counts
    with counts.lock:
        _count(counts, f"{RETRY}:{tool}", shared_now() if now is None else now)


def _count(counts: _Counts, field: str, at: float) -> None:
    # Under counts.lock: one more of field in each bucket that holds the moment at.
    for width in BUCKETS:
        start = int(at // width) * width
        counts.pending.setdefault(keys.stats(f"{width}:{start}"), Counter())[field] += 1
    while len(counts.pending) > _MAX_PENDING_BUCKETS:  # nothing flushes: keep the newest
        del counts.pending[next(iter(counts.pending))]


def pending() -> dict[str, dict[str, int]]:
    """A copy of this process's counts not yet flushed (bucket key -> field -> calls)."""
    with _counts.lock:
        return {key: dict(fields) for key, fields in _counts.pending.items()}


def flush_into(pipe: Any) -> int:
    """Queue this process's pending counts on a Redis pipeline; returns the fields queued.

    The caller executes the pipeline (the heartbeat sends it with its beat). Counts
    whose pipeline then fails are lost.
    """
    taken = _counts.take()
    queued = 0
    for key, fields in taken.items():
        width = int(key.rsplit(":", 2)[-2])
        for field, calls in fields.items():
            pipe.hincrby(key, field, calls)
            queued += 1
        pipe.expire(key, BUCKETS[width])
    return queued


def flush_now() -> None:
    """Send this process's pending counts now (a prefork child that exits); never raises."""
    url, master = _counts.redis_url, _counts.sentinel_master
    if not url or not pending():
        return
    try:
        pipe = redis_client_for_url(url, master=master).pipeline(transaction=False)
        if flush_into(pipe):
            pipe.execute()
    except redis.RedisError:
        return  # counts for operators: these are lost


def _flush_forever(counts: _Counts) -> None:
    """A prefork child's flusher: every :data:`FLUSH_INTERVAL` s, send what was counted."""
    while True:
        time.sleep(FLUSH_INTERVAL)
        if counts is not _counts:  # this process forked; the copy's thread is not ours
            return
        flush_now()


@dataclass(frozen=True, slots=True)
class ToolCounts:
    """Calls of one tool in one window, by category and by outcome kind, and its retries."""

    done: int = 0
    failed: int = 0
    timed_out: int = 0
    by_kind: tuple[tuple[str, int], ...] = ()
    #: Attempts that retried a call (``@tool(retries=...)``).
    retries: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The counts as JSON-ready data."""
        return {
            "done": self.done,
            "failed": self.failed,
            "timed_out": self.timed_out,
            "by_kind": dict(self.by_kind),
            "retries": self.retries,
        }


def _bucket_keys(now: float, window: int, width: int) -> list[str]:
    """Keys of the buckets of ``width`` that overlap the ``window`` seconds before ``now``."""
    last = int(now // width) * width
    first = int((now - window) // width) * width
    return [keys.stats(f"{width}:{start}") for start in range(first, last + 1, width)]


def read_counts(client: redis.Redis, now: float) -> dict[str, dict[str, ToolCounts]]:
    """Calls per tool in each of :data:`WINDOWS` ending at ``now`` (Redis' clock).

    Returns window name -> tool -> counts; a tool with no calls in a window is absent
    from it. One pipelined round trip.
    """
    plan = [(name, _bucket_keys(now, window, width)) for name, (window, width) in WINDOWS.items()]
    pipe = client.pipeline(transaction=False)
    for _, bucket_keys in plan:
        for key in bucket_keys:
            pipe.hgetall(key)
    answers = iter(pipe.execute())
    windows: dict[str, dict[str, ToolCounts]] = {}
    for name, bucket_keys in plan:
        by_tool: dict[str, Counter[str]] = {}
        for _ in bucket_keys:
            for raw_field, raw_calls in next(answers).items():
                field = raw_field.decode() if isinstance(raw_field, bytes) else str(raw_field)
                kind, _, tool = field.partition(":")
                by_tool.setdefault(tool, Counter())[kind] += int(raw_calls)
        windows[name] = {tool: _summarise(kinds) for tool, kinds in sorted(by_tool.items())}
    return windows


def _summarise(kinds: Counter[str]) -> ToolCounts:
    retries = kinds.pop(RETRY, 0)
    totals: Counter[str] = Counter()
    for kind, calls in kinds.items():
        totals[CATEGORY.get(kind, "failed")] += calls
    return ToolCounts(
        done=totals["done"],
        failed=totals["failed"],
        timed_out=totals["timed_out"],
        by_kind=tuple(sorted(kinds.items())),
        retries=retries,
    )
