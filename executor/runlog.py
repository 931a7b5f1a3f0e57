"""The worker's half of the run log (:mod:`wire.runlog`): when each call ran, where, and
how it ended, written off the call's way.

The call path tells this module, in memory only (one lock, no I/O): a call is about to
run here (:func:`running`), each attempt of its tool starts (:func:`attempt`: the first
is when it started), it reports progress
(:func:`progress`), its outcome is delivered (:func:`ended`). One thread per worker
process (a prefork child has its own) writes what it was told every
:data:`wire.runlog.FLUSH_INTERVAL` seconds, in one pipeline:

* ``ended`` for each delivered outcome (its worker, start, attempts, kind and error
  type), so a call that ends within one interval costs one ``XADD`` in all;
* ``started`` for a call still running after one interval, so a live run shows it;
* the latest progress of each running call that reported since the last flush (an
  ``HSET`` in its run's progress hash).

An event is added to its run's log only if that log exists (``NOMKSTREAM``): the client
creates it, with its TTL, when it logs the call as sent. An event whose log is not there
yet (the client's write still on its way) is tried again each flush, and after
:data:`_CREATE_AFTER` flushes the log is made with the TTL. Events a process holds when
Redis refuses them are kept (at most :data:`_MAX_PENDING`, the oldest dropped first) and
sent with the next flush; those a process holds when it dies are lost: the log is for
people, not for billing. A prefork child sends what it holds as it exits
(:func:`flush_now`, at Celery's ``worker_process_shutdown``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field

import redis

from executor.worker import in_pool_child, redis_client
from wire import keys
from wire.models import CallOutcome, CallRequest
from wire.runlog import (
    ENDED,
    FLUSH_INTERVAL,
    STARTED,
    event,
    logged_json,
    now_ms,
    progress_value,
    run_of,
)
from wire.settings import Settings

__all__ = [
    "attempt",
    "ended",
    "flush_now",
    "forget",
    "pending",
    "progress",
    "running",
    "set_pool",
]

logger = logging.getLogger(__name__)

#: Events a process keeps unsent at most; past it the oldest are dropped.
_MAX_PENDING = 10_000
#: Flushes an event waits for its run's log to appear before it makes the log itself.
_CREATE_AFTER = 25


@dataclass(slots=True)
class _Running:
    """A call whose tool runs in this process."""

    run: str
    worker: str
    #: When its tool's first attempt started (ms on Redis' clock); None before.
    started: int | None = None
    attempts: int = 0
    announced: bool = False


@dataclass(slots=True)
class _Event:
    key: str
    entry: dict[str, str]
    tries: int = 0


@dataclass(eq=False)
class _Log:
    """This process's run log not yet in Redis."""

    changed: threading.Condition = field(default_factory=threading.Condition)
    running: dict[str, _Running] = field(default_factory=dict)
    events: list[_Event] = field(default_factory=list)
    #: call id -> (its run's progress hash, its latest progress)
    progress: dict[str, tuple[str, str]] = field(default_factory=dict)
    settings: Settings | None = None
    flusher: threading.Thread | None = None
    dropped: int = 0

    def busy(self) -> bool:
        return bool(self.events or self.progress or self.running)


_log = _Log()
#: The pool of this worker's main process (``worker_ready``); a prefork child's is prefork.
_pool = ""


def set_pool(name: str) -> None:
    """Name the pool the calls of this worker run on (its main process, once ready)."""
    global _pool
    _pool = name


def _pool_here() -> str | None:
    return "prefork" if in_pool_child() else (_pool or None)


def _forget_after_fork() -> None:
    # A forked pool child starts with nothing to write: its parent's is its parent's.
    global _log
    _log = _Log()


os.register_at_fork(after_in_child=_forget_after_fork)


def running(call: CallRequest, *, worker: str, settings: Settings) -> None:
    """``call`` is about to run in this process, on ``worker``; no I/O."""
    if not settings.run_log:
        return
    log = _log
    with log.changed:
        log.running[call.call_id] = _Running(run_of(call.run_id, call.reply_to), worker)
        _wake(log, settings)


def attempt(call_id: str, number: int) -> None:
    """Attempt ``number`` of a running call's tool starts (a retry when over 1); no I/O."""
    log = _log
    with log.changed:
        running = log.running.get(call_id)
        if running is not None:
            if running.started is None:
                running.started = now_ms()
            running.attempts = max(running.attempts, number)


def forget(call_id: str) -> None:
    """A running call's run ended with no outcome to deliver here (it raised through the
    task: a cold shutdown, say); no I/O."""
    log = _log
    with log.changed:
        log.running.pop(call_id, None)
        log.progress.pop(call_id, None)


def progress(call_id: str, done: float, total: float | None) -> None:
    """A running call reported progress; no I/O. Only the latest report is written."""
    log = _log
    with log.changed:
        running = log.running.get(call_id)
        if running is not None:
            log.progress[call_id] = (keys.run_progress(running.run), progress_value(done, total))


def ended(
    call: CallRequest, outcome: CallOutcome, *, settings: Settings, log_arguments: bool = False
) -> None:
    """``outcome`` of ``call`` was delivered; no I/O. ``log_arguments``: its tool opted in
    to having its arguments and result logged (``@tool(log_arguments=True)``)."""
    if not settings.run_log:
        return
    error = outcome.error
    fields: dict[str, str | int | None] = {
        "tool": call.tool,
        "worker": outcome.worker or None,
        "pool": _pool_here(),
        "kind": "ok" if outcome.ok else (error.kind.value if error is not None else "execution"),
        "type": error.type if error is not None else None,
    }
    if log_arguments:
        fields["arguments"] = logged_json(call.arguments)
        if outcome.ok:
            fields["result"] = logged_json(outcome.result)
        elif error is not None:
            fields["message"] = logged_json(error.message)
    log = _log
    with log.changed:
        running = log.running.pop(call.call_id, None)
        run = run_of(call.run_id, call.reply_to)
        if running is not None and running.started is not None:
            fields["started"] = running.started
            fields["worker"] = fields["worker"] or running.worker
            fields["attempts"] = running.attempts
        if error is not None and error.attempts > 1:
            fields["attempts"] = error.attempts
        _add(log, _Event(keys.run_log(run), event(ENDED, call.call_id, fields)))
        _wake(log, settings)


def pending() -> int:
    """How many events this process holds unsent."""
    with _log.changed:
        return len(_log.events)


def flush_now() -> None:
    """Send what this process holds now (a prefork child that exits); never raises."""
    _flush(_log)


def _add(log: _Log, item: _Event) -> None:
    # Under log.changed.
    log.events.append(item)
    if len(log.events) > _MAX_PENDING:
        del log.events[0]
        log.dropped += 1


def _wake(log: _Log, settings: Settings) -> None:
    # Under log.changed: the flusher writes within an interval.
    log.settings = settings
    if log.flusher is None:
        log.flusher = threading.Thread(
            target=_flush_forever, args=(log,), name="toolexec-runlog", daemon=True
        )
        log.flusher.start()
    log.changed.notify()


def _flush_forever(log: _Log) -> None:
    while log is _log:  # a forked child's copy of this thread's log is not its own
        with log.changed:
            while not log.busy():
                log.changed.wait()
        time.sleep(FLUSH_INTERVAL)
        _flush(log)


def _flush(log: _Log) -> None:
    settings = log.settings
    if settings is None:
        return
    with log.changed:
        events, log.events = log.events, []
        progress, log.progress = log.progress, {}
        due = now_ms() - int(FLUSH_INTERVAL * 1000)
        for call_id, running in log.running.items():
            if not running.announced and running.started is not None and running.started <= due:
                running.announced = True
                fields = {"worker": running.worker, "pool": _pool_here()}
                entry = event(STARTED, call_id, fields, at=running.started)
                events.append(_Event(keys.run_log(running.run), entry))
    if not events and not progress:
        return
    ttl_ms = settings.run_log_ttl * 1000
    try:
        pipe = redis_client(settings).pipeline(transaction=False)
        for item in events:
            create = item.tries >= _CREATE_AFTER
            pipe.xadd(
                item.key,
                item.entry,  # type: ignore[arg-type]
                maxlen=settings.run_log_max,
                approximate=True,
                nomkstream=not create,
            )
            if create:
                pipe.pexpire(item.key, ttl_ms)
        by_key: dict[str, dict[str, str]] = {}
        for call_id, (key, value) in progress.items():
            by_key.setdefault(key, {})[call_id] = value
        for key, values in by_key.items():
            pipe.hset(key, mapping=values)  # type: ignore[arg-type]
            pipe.pexpire(key, ttl_ms)
        replies = pipe.execute(raise_on_error=False)
    except redis.RedisError as exc:  # no answer at all: all of it goes with the next flush
        logger.debug("run log: %d events kept for later: %s", len(events), type(exc).__name__)
        with log.changed:
            log.events[:0] = events
            del log.events[: max(0, len(log.events) - _MAX_PENDING)]
        return
    answers = iter(replies)
    later: list[_Event] = []
    refused: list[str] = []
    for item in events:
        created = item.tries >= _CREATE_AFTER
        answer = next(answers)
        if created:
            next(answers)
        if isinstance(answer, redis.ResponseError):  # Redis will not take it (an ACL, say)
            refused.append(str(answer))
        elif isinstance(answer, Exception) or (answer is None and not created):
            item.tries += 1  # not taken now, or its run's log is not there yet
            later.append(item)
    if refused:
        logger.warning("run log: Redis refused %d events: %s", len(refused), refused[0])
    if later:
        with log.changed:
            log.events[:0] = later
