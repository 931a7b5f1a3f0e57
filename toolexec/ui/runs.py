"""Reading the run log (:mod:`wire.runlog`): the recent runs, and one run's calls.

:func:`calls_of` folds a run's events into one :class:`CallView` per call, with no I/O.
A :class:`RunReader` reads Redis for the UI and reads each entry of a log once: it keeps
each run's calls as folded so far (the :data:`KEPT_RUNS` it read last, at most
:data:`KEPT_CALLS` calls in all), and a page's
refresh asks only for the entries after the last one it folded, at most
:data:`READ_CHUNK` per ``XRANGE`` (Redis answers each in about a millisecond: a run of
10,000 events, or fifty of them on the recent-runs page, never hold the server that
serves the fleet's calls, however often a page refreshes); a log trimmed past what it
folded (``MAXLEN``), or made again after it lapsed, is read whole, so a page shows what
the log holds, as a first read does. A call's ``status`` is what
its caller was told, when it was told something:

* ``queued`` (sent, not started), ``running``;
* ``ok``, ``error`` (the tool raised, or its arguments or name were refused),
  ``timeout`` (the caller's deadline passed first, or the tool ran past its hard limit),
  ``expired`` (its deadline passed before it started), ``shed`` (its caller was gone
  before it started), ``cancelled``, ``lost`` (the worker died, past its deliveries),
  ``unavailable`` (never sent: Redis or RabbitMQ did not take it), ``unknown`` (sent or
  not: Redis stopped answering), ``abandoned`` (the caller stopped waiting).

An end the caller saw (its deadline, a cancel, an error the client made) wins over the
worker's later one, which still gives the run's end (``ran_until``): a call that timed out
while its tool ran on shows both.
"""

from __future__ import annotations

import copy
import json
import sys
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from wire import keys
from wire.runlog import (
    ABANDONED,
    ANSWERED,
    ENDED,
    FAILED,
    JOINED,
    RESENT,
    SENT,
    STARTED,
    TIMEOUT,
)

__all__ = [
    "KEPT_CALLS",
    "KEPT_RUNS",
    "LIVE",
    "RANGES_PER_ROUND",
    "READ_CHUNK",
    "CallView",
    "RunReader",
    "RunSummary",
    "calls_of",
    "summarise",
]

#: The statuses of a call not ended.
LIVE = ("queued", "running")

#: Entries one ``XRANGE`` of a run's log reads at most.
READ_CHUNK = 1000
#: Runs whose calls a :class:`RunReader` keeps folded (the least recently read go first).
KEPT_RUNS = 100
#: Calls a :class:`RunReader` keeps folded in all: past it the least recently read runs
#: go first, but never those a read is showing.
KEPT_CALLS = 200_000
#: An entry's fields whose values many calls share (kept once: ``sys.intern``).
_SHARED_FIELDS = ("tool", "queue", "worker", "pool", "kind", "type")
#: Ranges one pipeline of a :class:`RunReader` asks for at most.
RANGES_PER_ROUND = 10

#: A worker's outcome kind (``wire.models.ErrorKind``) -> the status it gives.
_KIND_STATUS = {
    "ok": "ok",
    "execution": "error",
    "invalid_arguments": "error",
    "not_found": "error",
    "hard_timeout": "timeout",
    "expired": "expired",
    "cancelled": "cancelled",
    "worker_lost": "lost",
}

#: The error a client made itself -> the status it gives.
_CLIENT_ERROR_STATUS = {
    "ToolTimeoutError": "timeout",
    "BrokerUnavailable": "unavailable",
    "ToolOutcomeUnknown": "unknown",
    "WorkerLost": "lost",
    "ToolCancelled": "cancelled",
    "CallerGone": "shed",
}


@dataclass(slots=True)
class CallView:
    """One call of a run, as its events tell it. Times are ms on Redis' clock."""

    call_id: str
    tool: str = ""
    status: str = "queued"
    sent_at: int | None = None
    started_at: int | None = None
    ended_at: int | None = None
    #: When the worker's run of it ended, when that is not when its caller heard.
    ran_until: int | None = None
    worker: str | None = None
    #: The pool of the worker that ran it (``prefork``, ``asyncio``, ...).
    pool: str | None = None
    attempts: int = 0
    #: It joined another call's execution of the same idempotent call (or its stored outcome).
    joined: bool = False
    #: Its outcome came from the store (a repeat of a call that had ended).
    stored: bool = False
    #: How many times its client's watchdog sent it again, lost with its worker.
    resent: int = 0
    error_kind: str | None = None
    error_type: str | None = None
    queue: str | None = None
    deadline: int | None = None
    #: The latest progress of a running call: ``done``, ``total``, ``t``.
    progress: dict[str, Any] | None = None
    #: Only for a tool that opted in (``@tool(log_arguments=True)``).
    arguments: Any = None
    result: Any = None
    _caller_ended: bool = field(default=False, repr=False)
    _worker_ended: bool = field(default=False, repr=False)

    def as_dict(self) -> dict[str, Any]:
        """The call as JSON-ready data."""
        data = asdict(self)
        del data["_caller_ended"], data["_worker_ended"]
        return data


@dataclass(frozen=True)
class RunSummary:
    """One run in the recent-runs list."""

    run_id: str
    started_at: int | None
    last_at: int | None
    calls: int
    failures: int
    live: int
    #: From its first call sent to its last end (or now, while a call is live), ms.
    time_spent: int

    def as_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready data."""
        return asdict(self)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _int(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def calls_of(
    events: list[dict[str, str]], progress: dict[str, str] | None = None
) -> list[CallView]:
    """Fold a run's events (oldest first) into its calls, in the order they were sent."""
    fold = _Fold()
    for entry in events:
        fold.add(entry)
    return fold.views(progress)


#: The id before every entry's: (ms, sequence) of nothing read yet.
_BEFORE = (0, -1)


class _Fold:
    """A run's calls as its events tell them: the log's entries from ``first`` to ``last``."""

    __slots__ = ("calls", "first", "last", "summary")

    def __init__(self) -> None:
        self.calls: dict[str, CallView] = {}
        #: The ids of the first and last entries folded in, as (ms, sequence).
        self.first: tuple[int, int] = _BEFORE
        self.last: tuple[int, int] = _BEFORE
        #: The run's summary as of ``last``, kept while none of its calls is live.
        self.summary: tuple[tuple[int, int], RunSummary] | None = None

    def add(self, entry: dict[str, str]) -> None:
        call_id = entry.get("call")
        kind = entry.get("e")
        at = _int(entry.get("t"))
        if not call_id or kind is None or at is None:
            return
        call = self.calls.get(call_id)
        if call is None:
            call = self.calls[call_id] = CallView(call_id=call_id)
        _apply(call, kind, at, entry)

    def views(self, progress: dict[str, str] | None = None) -> list[CallView]:
        """The calls as a page shows them: copies, their times in order, with ``progress``."""
        calls = {call_id: copy.copy(call) for call_id, call in self.calls.items()}
        for call in calls.values():
            _in_order(call)
        for call_id, raw in (progress or {}).items():
            found = calls.get(call_id)
            if found is not None:
                try:
                    found.progress = json.loads(raw)
                except ValueError:
                    continue
        return sorted(calls.values(), key=lambda c: (c.sent_at is None, c.sent_at or 0))

    def summarise(self, run_id: str, now: int) -> RunSummary:
        if self.summary is not None and self.summary[0] == self.last:
            return self.summary[1]
        summary = summarise(run_id, self.views(), now)
        self.summary = None if summary.live else (self.last, summary)
        return summary


def _in_order(call: CallView) -> None:
    """Keep a call's times in the order they happened: each side reads Redis' clock through
    its own estimate of its offset, so a worker's start can read a millisecond or two
    before its client's send."""
    if call.sent_at is not None and call.started_at is not None:
        call.started_at = max(call.started_at, call.sent_at)
    first = call.started_at if call.started_at is not None else call.sent_at
    if first is not None and call.ended_at is not None:
        call.ended_at = max(call.ended_at, first)
    if call.ran_until is not None and call.started_at is not None:
        call.ran_until = max(call.ran_until, call.started_at)


def _apply(call: CallView, kind: str, at: int, entry: dict[str, str]) -> None:
    call.tool = call.tool or entry.get("tool", "")
    if kind == SENT:
        call.sent_at = at if call.sent_at is None else min(call.sent_at, at)
        call.queue = entry.get("queue", call.queue)
        call.deadline = _int(entry.get("deadline")) or call.deadline
    elif kind == JOINED:
        call.joined = True
        call.stored = call.stored or entry.get("stored") == "1"
    elif kind == RESENT:
        call.resent = max(call.resent, _int(entry.get("generation")) or 0)
    elif kind == STARTED:
        call.started_at = call.started_at or at
        call.worker = entry.get("worker") or call.worker
        call.pool = entry.get("pool") or call.pool
        if call.status == "queued":
            call.status = "running"
    elif kind == ENDED:
        _worker_end(call, at, entry)
    elif kind == ANSWERED:  # the caller's word: a worker's end, when logged, tells more
        if not call._caller_ended and not call._worker_ended:
            call.ended_at = at
            call.status = _KIND_STATUS.get(entry.get("kind", ""), "error")
            call.error_kind = None if entry.get("kind") == "ok" else entry.get("kind")
    elif kind in (TIMEOUT, FAILED, ABANDONED):
        call._caller_ended = True
        if call.ended_at is not None and call.status not in LIVE:
            call.ran_until = call.ran_until or call.ended_at
        call.ended_at = at
        error = entry.get("type", "")
        if kind == ABANDONED:
            call.status = "abandoned"
        else:
            call.status = _CLIENT_ERROR_STATUS.get(error, "timeout" if kind == TIMEOUT else "error")
        call.error_kind = call.status
        call.error_type = error or None


def _worker_end(call: CallView, at: int, entry: dict[str, str]) -> None:
    started = _int(entry.get("started"))
    if started is not None:
        call.started_at = started
    call.worker = entry.get("worker") or call.worker
    call.pool = entry.get("pool") or call.pool
    call.attempts = _int(entry.get("attempts")) or call.attempts or (1 if started else 0)
    for name in ("arguments", "result"):
        if name in entry:
            try:
                setattr(call, name, json.loads(entry[name]))
            except ValueError:
                setattr(call, name, entry[name])
    if call._caller_ended:  # its caller had heard already: the run went on past that
        call.ran_until = at
        return
    call._worker_ended = True
    kind = entry.get("kind", "execution")
    call.ended_at = at
    call.error_kind = None if kind == "ok" else kind
    call.error_type = entry.get("type")
    status = _KIND_STATUS.get(kind, "error")
    if kind == "expired" and call.error_type == "CallerGone":
        status = "shed"
    call.status = status


def summarise(run_id: str, calls: list[CallView], now: int) -> RunSummary:
    """A run's line in the recent-runs list."""
    sent = [c.sent_at for c in calls if c.sent_at is not None]
    ends = [max(filter(None, (c.ended_at, c.ran_until))) for c in calls if c.ended_at]
    live = sum(1 for c in calls if c.status in LIVE)
    failures = sum(1 for c in calls if c.status not in LIVE and c.status != "ok")
    first = min(sent) if sent else None
    last = now if live else (max(ends) if ends else first)
    return RunSummary(
        run_id=run_id,
        started_at=first,
        last_at=max(ends) if ends else first,
        calls=len(calls),
        failures=failures,
        live=live,
        time_spent=0 if first is None or last is None else max(0, last - first),
    )


def _entry_id(value: Any) -> tuple[int, int]:
    ms, _, sequence = _text(value).partition("-")
    return int(ms), int(sequence or 0)


def _entry(fields: dict[Any, Any]) -> dict[str, str]:
    """A log entry's fields as text, the values many calls share kept once."""
    entry = {_text(k): _text(v) for k, v in fields.items()}
    for name in _SHARED_FIELDS:
        value = entry.get(name)
        if value is not None:
            entry[name] = sys.intern(value)
    return entry


def _id_text(entry_id: tuple[int, int]) -> str:
    return f"{entry_id[0]}-{entry_id[1]}"


class RunReader:
    """The UI's reader of run logs: each entry read and folded once (see the module).

    Args:
        client: The Redis that holds the logs (``TOOLEXEC_REDIS_URL``).
        chunk: Entries one ``XRANGE`` reads at most.
        keep: Runs whose calls are kept folded.
        keep_calls: Calls kept folded in all, over the kept runs.

    Safe to call from several threads (Starlette runs the UI's handlers on a pool).
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        chunk: int = READ_CHUNK,
        keep: int = KEPT_RUNS,
        keep_calls: int = KEPT_CALLS,
    ):
        if chunk < 2:
            raise ValueError(f"chunk must be at least 2 entries, got {chunk}")
        self._client = client
        self._chunk = chunk
        self._keep = keep
        self._keep_calls = keep_calls
        self._folds: OrderedDict[str, _Fold] = OrderedDict()
        self._lock = threading.Lock()

    def run(self, run_id: str) -> list[CallView] | None:
        """The calls of run ``run_id``, or None when Redis has no log of it."""
        progress: dict[str, str] = {}
        folds = self._read([run_id], progress_of=run_id, progress=progress)
        if run_id not in folds:
            return None
        with self._lock:
            return folds[run_id].views(progress)

    def runs(self, now: int, *, limit: int = 50) -> list[RunSummary]:
        """The ``limit`` runs whose calls were sent latest, newest first (runs whose log
        has lapsed are left out)."""
        run_ids = [_text(r) for r in self._client.zrevrange(keys.RUNS, 0, limit - 1)]
        if not run_ids:
            return []
        folds = self._read(run_ids)
        with self._lock:
            return [folds[r].summarise(r, now) for r in run_ids if r in folds]

    def _read(
        self,
        run_ids: list[str],
        *,
        progress_of: str | None = None,
        progress: dict[str, str] | None = None,
    ) -> dict[str, _Fold]:
        """Fold in what each run's log holds past what this reader has folded; the folds
        of the runs whose log exists.

        A kept fold goes on only while the log still starts at or before its first entry
        and still holds its last: a log trimmed past what the fold holds (``MAXLEN``), or
        one that lapsed and was made again, is read whole, so a page shows what the log
        holds, as a first read would.
        """
        with self._lock:
            known = {run_id: self._folds.get(run_id) for run_id in run_ids}
        #: Each run's last entry taken (a kept fold's last at first): the next range
        #: starts there, inclusive, and only entries after it are taken.
        after = {r: _BEFORE if fold is None else fold.last for r, fold in known.items()}
        read: dict[str, list[tuple[tuple[int, int], dict[str, str]]]] = {r: [] for r in run_ids}
        #: Each log's first entry's id (None: no log), read in the first round.
        heads: dict[str, tuple[int, int] | None] | None = None
        resumed = {r for r, fold in known.items() if fold is not None}
        broken: set[str] = set()  # a kept fold's last entry is gone from its log
        todo = list(run_ids)
        while todo or heads is None:
            # At most RANGES_PER_ROUND ranges a round trip: Redis runs a pipeline's
            # commands back to back, so a round holds it for about as many milliseconds.
            now, todo = todo[:RANGES_PER_ROUND], todo[RANGES_PER_ROUND:]
            pipe = self._client.pipeline(transaction=False)
            for run_id in now:
                start = "-" if after[run_id] == _BEFORE else _id_text(after[run_id])
                pipe.xrange(keys.run_log(run_id), min=start, count=self._chunk)
            if heads is None:  # the first round: where each log starts, the progress asked
                for run_id in run_ids:
                    pipe.xrange(keys.run_log(run_id), count=1)
                if progress_of is not None:
                    pipe.hgetall(keys.run_progress(progress_of))
            replies = pipe.execute()
            ranges, rest = replies[: len(now)], replies[len(now) :]
            if heads is None:
                heads = {
                    r: _entry_id(head[0][0]) if head else None
                    for r, head in zip(run_ids, rest, strict=False)
                }
                if progress_of is not None and progress is not None:
                    progress.update({_text(k): _text(v) for k, v in rest[-1].items()})
            for run_id, raw in zip(now, ranges, strict=True):
                got = [(_entry_id(i), fields) for i, fields in raw or []]
                if run_id in resumed:
                    # A kept fold's first range starts at its last entry (inclusive), which
                    # must still be there.
                    resumed.discard(run_id)
                    if not got or got[0][0] != after[run_id]:
                        broken.add(run_id)
                        continue
                taken = [(i, _entry(fields)) for i, fields in got if i > after[run_id]]
                if taken:
                    read[run_id] += taken
                    after[run_id] = taken[-1][0]
                if len(got) == self._chunk:  # more after its last
                    todo.append(run_id)
        again = []
        folds: dict[str, _Fold] = {}
        with self._lock:
            for run_id in run_ids:
                fold, was, head = self._folds.get(run_id), known[run_id], heads.get(run_id)
                if head is None or (fold is None and not read[run_id] and was is None):
                    self._folds.pop(run_id, None)  # lapsed, or never logged
                    continue
                if was is not None and (fold is not was or run_id in broken or head > was.first):
                    # Let go of meanwhile, or its log trimmed past it or made again: what
                    # was read does not go on from what is kept; the log is read whole.
                    if fold is was:
                        del self._folds[run_id]
                    again.append(run_id)
                    continue
                if fold is None:
                    fold = self._folds[run_id] = _Fold()
                for entry_id, entry in read[run_id]:
                    if entry_id > fold.last:  # another request may have folded it meanwhile
                        if fold.first == _BEFORE:
                            fold.first = entry_id
                        fold.add(entry)
                        fold.last = entry_id
                self._folds.move_to_end(run_id)
                folds[run_id] = fold
            self._let_go(keep=set(run_ids))
        if again:
            folds.update(self._read(again))
        return folds

    def _let_go(self, *, keep: set[str]) -> None:
        """Let go of the least recently read runs past :data:`KEPT_RUNS` runs or
        :data:`KEPT_CALLS` calls, never of ``keep`` (the runs a read is showing); under
        the lock."""
        calls = sum(len(fold.calls) for fold in self._folds.values())
        while self._folds and (len(self._folds) > self._keep or calls > self._keep_calls):
            oldest = next(iter(self._folds))
            if oldest in keep:
                break  # the rest were read now
            calls -= len(self._folds.pop(oldest).calls)
