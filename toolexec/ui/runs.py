"""Reading the run log (:mod:`wire.runlog`): the recent runs, and one run's calls.

:func:`calls_of` folds a run's events into one :class:`CallView` per call, with no I/O;
:func:`read_runs` and :func:`read_run` read Redis (one pipelined round trip each) and
fold. A call's ``status`` is what its caller was told, when it was told something:

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

import json
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

__all__ = ["LIVE", "CallView", "RunSummary", "calls_of", "read_run", "read_runs", "summarise"]

#: The statuses of a call not ended.
LIVE = ("queued", "running")

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


@dataclass
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
    calls: dict[str, CallView] = {}
    for entry in events:
        call_id = entry.get("call")
        kind = entry.get("e")
        at = _int(entry.get("t"))
        if not call_id or kind is None or at is None:
            continue
        call = calls.setdefault(call_id, CallView(call_id=call_id))
        _apply(call, kind, at, entry)
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


def _events(raw: Any) -> list[dict[str, str]]:
    return [{_text(k): _text(v) for k, v in fields.items()} for _, fields in raw or []]


def read_run(client: redis.Redis, run_id: str) -> list[CallView] | None:
    """The calls of run ``run_id``, or None when Redis has no log of it."""
    pipe = client.pipeline(transaction=False)
    pipe.xrange(keys.run_log(run_id))
    pipe.hgetall(keys.run_progress(run_id))
    raw, progress = pipe.execute()
    if not raw:
        return None
    return calls_of(_events(raw), {_text(k): _text(v) for k, v in progress.items()})


def read_runs(client: redis.Redis, now: int, *, limit: int = 50) -> list[RunSummary]:
    """The ``limit`` runs whose calls were sent latest, newest first (runs whose log has
    lapsed are left out)."""
    run_ids = [_text(r) for r in client.zrevrange(keys.RUNS, 0, limit - 1)]
    if not run_ids:
        return []
    pipe = client.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.xrange(keys.run_log(run_id))
    summaries = []
    for run_id, raw in zip(run_ids, pipe.execute(), strict=True):
        if raw:
            summaries.append(summarise(run_id, calls_of(_events(raw)), now))
    return summaries
