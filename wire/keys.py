"""Every Redis key toolexec writes, and the rules for their TTLs, in one place.

Everything but the catalog (``CATALOG`` and ``WORKERS``) is written with a TTL. The
keys written for one call (its claim, waiters, sent marker, its key's state while it
runs, count of lost deliveries) live as long as :func:`call_ttl_ms` says, on both sides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from wire.clock import shared_now

if TYPE_CHECKING:
    from wire.settings import Settings

__all__ = [
    "CANCELLED",
    "CANCELS",
    "CATALOG",
    "DEADLETTER",
    "DEADLETTER_COUNT",
    "CALLER_GONE_BEATS",
    "HELD_MARKER_BEATS",
    "PREFIX",
    "WORKERS",
    "call_ttl_ms",
    "caller",
    "caller_absent",
    "claim",
    "deliveries",
    "fence",
    "handle",
    "handle_waiters",
    "left",
    "reply",
    "restored",
    "RUNS",
    "run_log",
    "run_progress",
    "running",
    "running_keys",
    "sent",
    "sent_copy",
    "state",
    "stats",
    "waiters",
    "worker",
]

PREFIX = "toolexec:"

#: Hash: tool name -> ToolSpec JSON. No TTL: it is the catalog.
CATALOG = PREFIX + "catalog"
#: Set of worker ids that have published a heartbeat. No TTL: pruned by readers.
WORKERS = PREFIX + "workers"
#: List of messages workers refused, newest first: one JSON entry each (reason, queue,
#: time, sha256 and size of the payload, the payload itself in base64, cut at
#: ``DEADLETTER_PAYLOAD_BYTES``). Capped at ``DEADLETTER_MAX_ENTRIES`` (LTRIM); TTL
#: ``DEADLETTER_TTL``, refreshed by every refusal.
DEADLETTER = PREFIX + "deadletter"
#: Hash: refusal reason -> how many messages were refused for it. TTL as ``DEADLETTER``.
DEADLETTER_COUNT = PREFIX + "deadletter:count"


#: The recent agent runs (a sorted set: run id scored by the time of its latest send, ms
#: on the shared clock), for ``toolexec ui``: entries older than ``TOOLEXEC_RUN_LOG_TTL``
#: are pruned by the clients that add to it (:mod:`wire.runlog`). TTL: as a run log's,
#: refreshed with each entry.
RUNS = PREFIX + "runs"


def run_log(run_id: str) -> str:
    """The event log of one agent run (a stream, :mod:`wire.runlog`; capped at
    ``TOOLEXEC_RUN_LOG_MAX`` events, TTL ``TOOLEXEC_RUN_LOG_TTL``). The run id is the
    key's hash tag, so a run's keys share one slot."""
    return f"{PREFIX}run:{{{run_id}}}:log"


def run_progress(run_id: str) -> str:
    """The latest progress of one agent run's calls (a hash: call id -> progress,
    :func:`wire.runlog.progress_value`; TTL as :func:`run_log`'s)."""
    return f"{PREFIX}run:{{{run_id}}}:progress"


def worker(worker_id: str) -> str:
    """Heartbeat of one worker (TTL: the heartbeat interval)."""
    return f"{PREFIX}worker:{worker_id}"


def left(worker_id: str) -> str:
    """A worker's word that it stopped warm, written as its heartbeat goes (TTL:
    :data:`LEFT_BEATS` intervals): it finished or put back every call it held, so a
    client that finds a call gone does not take the worker's departure for a death."""
    return f"{PREFIX}left:{worker_id}"


def reply(client_id: str) -> str:
    """List of outcomes waiting for one client process (TTL: reply_ttl)."""
    return f"{PREFIX}reply:{client_id}"


def caller(client_id: str) -> str:
    """That a client process still waits for its calls: a worker sheds a queued call whose
    caller's key is gone (``CallRequest.caller_beats``).

    TTL: one heartbeat interval, refreshed three times per interval by the client. Holds
    ``gone`` (for :data:`CALLER_GONE_BEATS` intervals) once the client closed, or once
    workers judged it gone (:data:`wire.scripts.CALLER_LOOK`).
    """
    return f"{PREFIX}caller:{client_id}"


#: How many heartbeat intervals a caller's key says ``gone`` once it is judged so.
CALLER_GONE_BEATS = 20


def caller_absent(client_id: str) -> str:
    """Since when workers have looked for a caller's key and not found it, while Redis took
    their writes (:data:`wire.scripts.CALLER_LOOK`). TTL: three heartbeat intervals."""
    return f"{PREFIX}caller-absent:{client_id}"


def claim(idempotency_key: str) -> str:
    """Who claimed an idempotent call (TTL: :func:`call_ttl_ms` ``"claim"``)."""
    return f"{PREFIX}claim:{idempotency_key}"


def state(idempotency_key: str) -> str:
    """The worker-side state of an idempotent call: who runs it (and whether callers
    joined), or its stored outcome (:func:`wire.formats.parse_state`).

    TTL: while it runs, :func:`call_ttl_ms` ``"running"`` (never shortened by a caller
    that joins); once stored, ``TOOLEXEC_OUTCOME_TTL``.
    """
    return f"{PREFIX}state:{idempotency_key}"


def waiters(idempotency_key: str) -> str:
    """Reply addresses of callers that joined an idempotent call (TTL: at least its claim's)."""
    return f"{PREFIX}waiters:{idempotency_key}"


def running(call_id: str) -> str:
    """The holder of a call, recorded under its call id by its worker's heartbeat.

    TTL: :data:`HELD_MARKER_BEATS` heartbeat intervals, refreshed by each beat.
    """
    return f"{PREFIX}running:{call_id}"


def deliveries(call_id: str) -> str:
    """How many times a worker process died running one call (TTL: :func:`call_ttl_ms`
    ``"deliveries"``)."""
    return f"{PREFIX}deliveries:{call_id}"


def sent_copy(call_id: str, generation: int) -> str:
    """The sent marker of a call's copy sent again as ``generation``
    (``wire.copies.sent_again``): pushed once, like the first send (:func:`sent`).

    TTL: :func:`call_ttl_ms` ``"fence"``.
    """
    return f"{PREFIX}sent:{call_id}#{generation}"


def handle(call_id: str) -> str:
    """A submitted call's state, for any process to attach to (a hash: ``tool``, ``queue``,
    ``deadline``, ``envelope``, ``status``, ``worker``, ``outcome``, ...).

    TTL: ``TOOLEXEC_HANDLE_TTL``, from its last change.
    """
    return f"{PREFIX}handle:{call_id}"


def handle_waiters(call_id: str) -> str:
    """The processes attached to a submitted call, waiting for its outcome (waiter entries,
    ``wire.formats.waiter_entry``). TTL: as :func:`handle`'s."""
    return f"{PREFIX}handle-waiters:{call_id}"


#: The calls cancelled lately (a sorted set: call id scored by when its entry lapses,
#: epoch seconds on the shared clock): a worker process reads it when it subscribes to
#: :data:`CANCELS`, and refuses to start a call it lists.
CANCELLED = PREFIX + "cancelled"


#: The channel a cancel is published on (the call id): every worker process listens.
CANCELS = PREFIX + "cancels"


def fence(call_id: str) -> str:
    """Which copy of a call sent again may start: the generation of the latest copy the
    client's watchdog sent, or ``x`` once the client gave the call up (no copy may).

    Only copies sent again (``wire.message.sent_again``) read it, before they start
    (``wire.scripts`` ``START``). TTL: :func:`call_ttl_ms` ``"fence"``.
    """
    return f"{PREFIX}fence:{call_id}"


def stats(bucket: str) -> str:
    """Hash of one time bucket of call counts, ``<kind>:<tool>`` -> calls (executor.stats).

    ``bucket`` is ``<width>:<start>``: seconds wide, starting at epoch second ``start``.
    TTL: the longest window read from buckets of that width, plus a margin.
    """
    return f"{PREFIX}stats:{bucket}"


def running_keys(call_id: str, idempotency_key: str | None) -> tuple[str, ...]:
    """Where a call's holder is recorded, most telling first.

    An idempotent call's begin step records it in the key's state before the call
    starts (read it with :func:`wire.formats.parse_state`); the worker's heartbeat
    records every call it holds under the call id.
    """
    if idempotency_key is None:
        return (running(call_id),)
    return (state(idempotency_key), running(call_id))


# -- TTL rules ----------------------------------------------------------------------

#: ``running:<call id>`` lives this many heartbeat intervals, refreshed by each beat.
HELD_MARKER_BEATS = 10
#: ``left:<worker id>`` lives this many heartbeat intervals: past the next catalog read
#: of every client whose calls are watched (one an interval at least).
LEFT_BEATS = 10

# The dead-letter rules are numbers, not keys, so they stay out of ``__all__`` (whose
# names tests/unit/test_keys.py builds keys from); import them by name.

#: The dead-letter list keeps the newest this many entries.
DEADLETTER_MAX_ENTRIES = 1000
#: Seconds the dead-letter list and its counts live after the last refusal (a week).
DEADLETTER_TTL = 7 * 86_400
#: A refused payload is kept in its dead-letter entry up to this many bytes.
DEADLETTER_PAYLOAD_BYTES = 65_536


#: The keys of one call whose TTL :func:`call_ttl_ms` gives.
CallKey = Literal["claim", "sent", "running", "deliveries", "fence"]


def call_ttl_ms(
    key: CallKey,
    *,
    deadline: float | None,
    hard_timeout: float | None,
    settings: Settings,
    now: float | None = None,
) -> int:
    """How many milliseconds a key written for one call lives: the one TTL rule.

    Such a key must outlive every delivery that may still run the call: the time left
    to its ``deadline`` (epoch seconds on the shared clock, less ``now``, which is
    :func:`wire.clock.shared_now` unless the caller has just read it), plus the tool's
    ``hard_timeout``, plus ``TOOLEXEC_CLAIM_MARGIN`` for a worker slow to report. A
    deadline already passed leaves the hard limit and the margin. Per ``key``:

    * ``"claim"``: an idempotent call's claim (and the waiters and waiter flag its
      joiners leave). Without a deadline the window is ``TOOLEXEC_OUTCOME_TTL``.
    * ``"sent"``: a plain call's sent marker (:func:`sent`). Without a deadline the
      window is ``TOOLEXEC_REPLY_TTL``: no caller waits longer for its reply.
    * ``"running"``: an idempotent call's state while a delivery runs it
      (:func:`state`): the claim's, but at most ``TOOLEXEC_OUTCOME_TTL``, as long as
      the stored outcome that replaces it is kept.
    * ``"deliveries"``: the count of a call's lost deliveries (:func:`deliveries`):
      the claim's, and at least a second.
    * ``"fence"``: which of a call's copies may start (:func:`fence`): the claim's
      (without a deadline, ``TOOLEXEC_REPLY_TTL``, as the sent marker), and at least a
      second.
    """
    if deadline is None:
        window = float(settings.reply_ttl if key in ("sent", "fence") else settings.outcome_ttl)
    else:
        window = max(0.0, deadline - (shared_now() if now is None else now))
    ttl = int((window + (hard_timeout or 0.0) + settings.claim_margin) * 1000)
    if key == "running":
        return max(1, min(ttl, settings.outcome_ttl * 1000))
    if key in ("deliveries", "fence"):
        return max(ttl, 1000)
    return ttl


def restored(delivery_tag: str, queue: str) -> str:
    """Records that a worker put a message it had taken back on ``queue`` (TTL:
    :data:`RESTORED_TTL`), so a put-back tried again after a broken connection cannot
    queue it twice.

    ``delivery_tag`` names the message: kombu's delivery tag for a message delivered
    but not started, the SHA-256 of the item for one a batched read took but never
    delivered (:mod:`executor.seams.put_back`)."""
    return f"{PREFIX}restored:{delivery_tag}:{queue}"


#: Seconds a put-back's record is kept: longer than any put-back keeps trying.
RESTORED_TTL = 60


def read_wake(reader_id: str) -> str:
    """The list an asyncio pool's reader of the queues also blocks on (on the broker), so
    that a token pushed there ends its read under way, popping nothing else
    (:mod:`executor.pools.reads`; TTL: :data:`READ_WAKE_TTL`)."""
    return f"{PREFIX}reads:wake:{reader_id}"


#: Seconds a wake token is kept: a token whose read had already ended wakes the next
#: read once, or lapses.
READ_WAKE_TTL = 60


def sent(call_id: str) -> str:
    """Records that a plain call's message was pushed (TTL: :func:`call_ttl_ms`
    ``"sent"``), so a re-send after an unknown outcome cannot queue it twice."""
    return f"{PREFIX}sent:{call_id}"
