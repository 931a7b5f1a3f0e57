"""The run log: each call's life, written into its agent run's capped event log in Redis.

Both sides write it; ``toolexec ui`` reads it (:mod:`toolexec.ui`). Each agent run has

* a stream of events, :func:`wire.keys.run_log` (``XADD ... MAXLEN ~`` the
  ``TOOLEXEC_RUN_LOG_MAX`` newest; TTL ``TOOLEXEC_RUN_LOG_TTL``, refreshed by the client
  as it sends the run's calls), one entry per event (:func:`event`);
* a hash of the latest progress of its running calls, :func:`wire.keys.run_progress`
  (call id -> :func:`progress_value`), with the same TTL;
* an entry in the recent-runs index :data:`wire.keys.RUNS` (run id scored by the time of
  its latest send).

A call with no run (sent outside ``run_scope()`` and any framework's run) is logged
under its client process (:func:`run_of`). Who writes what:

* the agent's client, from its I/O thread and never on a call's way: ``sent`` once
  Redis (or RabbitMQ) took the call, ``joined`` when an idempotent call joined another's
  execution or was answered from the store, and the ends only it sees: ``answered`` (a
  joined call's outcome), ``timeout`` (the caller's deadline passed), ``abandoned`` (the
  caller stopped waiting), ``failed`` (an error the client itself made: lost, not sent),
  and ``resent`` when its watchdog sent a call lost with its worker again (``generation``);
* the worker, from one thread per process every :data:`FLUSH_INTERVAL`: ``started`` for
  a call still running after one interval, and ``ended`` for each delivered outcome,
  with its start, worker, attempts and kind (:mod:`executor.runlog`).

Never a call's arguments or result, unless its tool opts in
(``@tool(log_arguments=True)``): the same rule as the logs. ``TOOLEXEC_RUN_LOG=off``
writes nothing, on the side that sets it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from wire.clock import shared_now

__all__ = [
    "ABANDONED",
    "ANSWERED",
    "ENDED",
    "EVENTS",
    "FAILED",
    "FLUSH_INTERVAL",
    "JOINED",
    "MAX_LOGGED_CHARS",
    "RESENT",
    "SENT",
    "STARTED",
    "TIMEOUT",
    "event",
    "logged_json",
    "now_ms",
    "progress_value",
    "run_of",
    "xadd_arguments",
]

SENT = "sent"
JOINED = "joined"
STARTED = "started"
ENDED = "ended"
ANSWERED = "answered"
TIMEOUT = "timeout"
ABANDONED = "abandoned"
FAILED = "failed"
RESENT = "resent"
#: Every kind of event, in the order of a call's life.
EVENTS = (SENT, JOINED, RESENT, STARTED, ENDED, ANSWERED, TIMEOUT, ABANDONED, FAILED)

#: Seconds between two flushes of a worker process's events; a call that ends sooner
#: is logged by one event (``ended``, with its start), a longer one by two.
FLUSH_INTERVAL = 0.2

#: Longest text of a tool's arguments or result logged (``log_arguments=True``).
MAX_LOGGED_CHARS = 4096


def run_of(run_id: str | None, client_id: str) -> str:
    """The run a call is logged under: its agent run, else its client process's."""
    return run_id if run_id else f"client-{client_id}"


def now_ms() -> int:
    """Now, in milliseconds on Redis' clock (:func:`wire.clock.shared_now`), so that
    events from hosts whose clocks differ line up."""
    return int(shared_now() * 1000)


def event(
    kind: str, call_id: str, fields: Mapping[str, Any] | None = None, *, at: int | None = None
) -> dict[str, str]:
    """One event of a call: ``e`` (its kind), ``call``, ``t`` (ms on Redis' clock, now
    unless ``at``), and ``fields`` as text (None left out)."""
    if kind not in EVENTS:
        raise ValueError(f"unknown run log event {kind!r}")
    entry = {"e": kind, "call": call_id, "t": str(now_ms() if at is None else at)}
    for name, value in (fields or {}).items():
        if value is None:
            continue
        entry[name] = value if isinstance(value, str) else json.dumps(value)
    return entry


def xadd_arguments(key: str, entry: dict[str, str], *, max_events: int) -> list[str]:
    """``XADD key MAXLEN ~ max_events * field value ...`` as a command's words."""
    words = ["XADD", key, "MAXLEN", "~", str(max_events), "*"]
    for name, value in entry.items():
        words += [name, value]
    return words


def progress_value(done: float, total: float | None, *, at: int | None = None) -> str:
    """A running call's latest progress as kept in its run's progress hash."""
    return json.dumps({"done": done, "total": total, "t": now_ms() if at is None else at})


def logged_json(value: Any) -> str:
    """``value`` as JSON text for the log of a tool that opted in, cut to
    :data:`MAX_LOGGED_CHARS`."""
    text = json.dumps(value, default=str)
    if len(text) > MAX_LOGGED_CHARS:
        text = text[: MAX_LOGGED_CHARS - 1] + "…"
    return text
