"""What the soak checks after its calls: errors, Redis keys, worker memory, bookings.

Each check returns what it found and the problems that fail the soak, so the report
(:mod:`bench.soak_report`) prints the figures and the verdict from the same numbers.

* **Errors.** Every call ends in a result or a typed error, and each error is allowed
  only where an injected fault explains it, up to a bound that fault justifies
  (:func:`error_bounds`).
* **Keys.** Every key left is of a kind the soak started with (the catalog, kombu's
  bindings, one heartbeat per live worker), or one whose TTL rule outlives the wait,
  with a TTL no longer than its rule; with ``--wait-ttl`` no key of any call is left.
* **RSS.** The same worker processes, sampled from after the last restart to the end,
  grow by at most :data:`RSS_GROWTH_LIMIT_KIB` each.
"""

from __future__ import annotations

import contextlib
import fcntl
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis

from executor.stats import BUCKETS
from wire import keys

__all__ = [
    "CALL_FAMILIES",
    "RSS_GROWTH_LIMIT_KIB",
    "ErrorBounds",
    "KeyCheck",
    "KeyRules",
    "Reruns",
    "check_errors",
    "check_keys",
    "check_rss",
    "ledger",
    "reruns",
    "rss_of",
    "runs_db",
    "wait_for_call_keys",
]

#: Families of the keys one call writes (``toolexec:<family>:...``); all expire within
#: seconds to minutes of the call.
CALL_FAMILIES = (
    "reply",
    "outcome",
    "claim",
    "waiters",
    "sent",
    "deliveries",
    "running",
    "fence",
    "state",
)
#: A worker process may grow by this much (KiB) over the soak's later phase. It leaves
#: room for the pool processes of a worker restarted just before it, which grow by a few
#: MiB over their first calls; a leak of 1 KiB per call passes it only over fewer than
#: 8,000 calls per process (the full soak sends each of its 6 about 700).
RSS_GROWTH_LIMIT_KIB = 8 * 1024


# -- errors --------------------------------------------------------------------------


@dataclass(frozen=True)
class ErrorBounds:
    """How many calls may end in each error, and why; every other error is a failure."""

    bounds: dict[str, int]
    reasons: dict[str, str]
    #: Tools that may end in ``WorkerLost`` (the at-most-once ones).
    worker_lost_tools: frozenset[str]


def error_bounds(
    *, kills: int, concurrency: int, redis_restarts: int, workers: int, at_most_once: Iterable[str]
) -> ErrorBounds:
    """The errors the soak's faults explain, with their bounds.

    * ``WorkerLost``: an at-most-once call on a worker that was SIGKILLed: each killed
      worker held at most ``concurrency`` running calls and ``concurrency`` prefetched
      ones (prefetch multiplier 1; an at-most-once call is acknowledged when it starts).
      An at-least-once call is sent again instead, never given up (it would take three
      deaths of its worker, and the soak kills two).
    * ``ToolOutcomeUnknown``: messages Redis popped for a worker's read just before a
      restart, whose reply never left it: per worker per restart, at most what one read
      takes (its free prefetch room, ``concurrency`` with prefetch multiplier 1).
    * Nothing else: the deadline outlasts every disruption (a worker restarts within
      seconds, Redis within one), so no call is ``BrokerUnavailable`` (every send is
      retried until its deadline) or ``ToolTimeoutError``, and the tools do not fail.
    """
    return ErrorBounds(
        bounds={
            "WorkerLost": kills * 2 * concurrency,
            "ToolOutcomeUnknown": redis_restarts * workers * concurrency,
        },
        reasons={
            "WorkerLost": (
                f"{kills} SIGKILLs x (2 x concurrency {concurrency}) at-most-once calls held"
            ),
            "ToolOutcomeUnknown": (
                f"{redis_restarts} Redis restart x {workers} workers' read of up to {concurrency}"
            ),
        },
        worker_lost_tools=frozenset(at_most_once),
    )


def check_errors(outcomes: Mapping[tuple[str, str], int], bounds: ErrorBounds) -> list[str]:
    """Problems with how the calls ended: ``outcomes`` maps (tool, outcome) to calls."""
    problems = []
    by_kind: Counter[str] = Counter()
    for (tool, kind), n in outcomes.items():
        if kind == "result":
            continue
        by_kind[kind] += n
        if kind == "WorkerLost" and tool not in bounds.worker_lost_tools:
            problems.append(f"{n} {tool} calls (at least once) ended WorkerLost")
    for kind, n in sorted(by_kind.items()):
        allowed = bounds.bounds.get(kind, 0)
        if n > allowed:
            problems.append(f"{n} calls ended {kind}; the faults explain at most {allowed}")
    return problems


# -- Redis keys ------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyRules:
    """The longest TTL each family of key may have, in seconds (from the settings)."""

    interval: float
    reply_ttl: float
    outcome_ttl: float
    claim_ttl: float  # deadline + hard limit + claim margin
    run_log_ttl: float  # each run's log and the recent-runs index (wire.runlog)

    def rule(self, family: str) -> float | None:
        """The family's longest TTL; None for a family the soak does not expect."""
        return {
            "worker": self.interval,
            "reply": self.reply_ttl,
            "outcome": self.outcome_ttl,
            "claim": self.claim_ttl,
            "waiters": self.claim_ttl,
            "sent": self.claim_ttl,
            "deliveries": self.claim_ttl,
            "fence": self.claim_ttl,
            "state": max(self.claim_ttl, self.outcome_ttl),
            "running": max(self.claim_ttl, keys.HELD_MARKER_BEATS * self.interval),
            "caller": self.interval,
            "left": keys.LEFT_BEATS * self.interval,
            "restored": float(keys.RESTORED_TTL),
            "stats": float(max(BUCKETS.values())),
            "deadletter": float(keys.DEADLETTER_TTL),
            "run": self.run_log_ttl,
            "runs": self.run_log_ttl,
        }.get(family)

    @property
    def longest_call_rule(self) -> float:
        """The longest TTL of a key one call writes."""
        return max(r for f in CALL_FAMILIES if (r := self.rule(f)) is not None)


@dataclass(frozen=True)
class KeyCheck:
    """The keys left after the soak."""

    baseline: int
    after: int
    #: family -> (keys, largest TTL in seconds, the rule's TTL)
    families: dict[str, tuple[int, int, float]] = field(default_factory=dict)
    #: Keys of the kinds the soak started with: catalog, workers set, heartbeats, the
    #: client's liveness, kombu's.
    baseline_kinds: int = 0
    #: Keys whose TTL rule outlives the wait (stats buckets, dead letters, put-backs, run
    #: logs).
    long_rule: int = 0
    over_rule: list[str] = field(default_factory=list)
    no_ttl: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    call_keys_left: int = 0

    def problems(self, *, waited: bool, live_workers: int) -> list[str]:
        """What fails the soak: keys over their rule, without a TTL, of no known kind;
        a heartbeat count that is not the live workers'; call keys left after a wait;
        a key count that is not the baseline's plus the long-rule keys."""
        problems = [f"{key} has a TTL longer than its rule" for key in self.over_rule[:5]]
        problems += [f"{key} has no TTL" for key in self.no_ttl[:5]]
        problems += [f"{key} is of no kind the soak knows" for key in self.unexpected[:5]]
        heartbeats = self.families.get("worker", (0, 0, 0.0))[0]
        if heartbeats != live_workers:
            problems.append(f"{heartbeats} heartbeats for {live_workers} live workers")
        if waited and self.call_keys_left:
            problems.append(f"{self.call_keys_left} keys of calls outlived their TTLs")
        if waited and self.after - self.long_rule != self.baseline:
            problems.append(
                f"DBSIZE {self.after} is not the baseline {self.baseline} plus {self.long_rule} "
                "long-rule keys"
            )
        return problems


def _family(key: str) -> str:
    return key[len(keys.PREFIX) :].split(":", 1)[0] if key.startswith(keys.PREFIX) else ""


def check_keys(db: redis.Redis, *, baseline: int, rules: KeyRules) -> KeyCheck:
    """Classify every key of the soak's Redis by its family and TTL rule."""
    families: dict[str, list[int]] = {}
    over, no_ttl, unexpected = [], [], []
    baseline_kinds = long_rule = call_left = 0
    for raw in db.scan_iter(count=1000):
        key = raw.decode()
        ttl = int(db.ttl(raw))
        if ttl == -2:
            continue  # expired since the scan saw it
        if key in (keys.CATALOG, keys.WORKERS) or key.startswith("_kombu.binding"):
            baseline_kinds += 1  # no TTL by design: the catalog, kombu's bindings
            continue
        family = _family(key)
        rule = rules.rule(family)
        if rule is None:
            unexpected.append(key)
            continue
        families.setdefault(family, []).append(ttl)
        if ttl == -1:
            no_ttl.append(key)
        elif ttl > rule + 1:  # TTL reads round up to whole seconds
            over.append(key)
        if family in ("worker", "caller"):  # heartbeats, and the client's own liveness
            baseline_kinds += 1
        elif family in CALL_FAMILIES:
            call_left += 1
        else:
            long_rule += 1
    return KeyCheck(
        baseline=baseline,
        after=int(db.dbsize()),
        families={
            f: (len(ttls), max(ttls, default=0), r)
            for f, ttls in sorted(families.items())
            if (r := rules.rule(f)) is not None
        },
        baseline_kinds=baseline_kinds,
        long_rule=long_rule,
        over_rule=sorted(over),
        no_ttl=sorted(no_ttl),
        unexpected=sorted(unexpected),
        call_keys_left=call_left,
    )


def wait_for_call_keys(db: redis.Redis, timeout: float) -> float:
    """Wait until no key of any call is left (they expire by their TTLs); seconds waited."""
    patterns = [f"{keys.PREFIX}{family}:*" for family in CALL_FAMILIES]

    def none_left() -> bool:
        return not any(next(iter(db.scan_iter(match=p, count=1000)), None) for p in patterns)

    return _poll(none_left, timeout, interval=0.5)


def _poll(condition: Callable[[], bool], timeout: float, interval: float = 0.1) -> float:
    start = time.monotonic()
    while not condition() and time.monotonic() - start < timeout:
        time.sleep(interval)
    return time.monotonic() - start


# -- worker RSS ------------------------------------------------------------------------


def rss_of(pids: Iterable[int]) -> dict[int, int]:
    """Resident set size in KiB of each of ``pids`` still alive."""
    found = {}
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    found[pid] = int(line.split()[1])
        except OSError:
            continue  # it just exited
    return found


def check_rss(samples: Sequence[dict[int, int]]) -> tuple[dict[int, int], list[str]]:
    """Growth (KiB) of each process found in every sample, first to last; the problems."""
    if len(samples) < 2:
        return {}, ["fewer than two RSS samples after the last restart"]
    common = set(samples[0]).intersection(*samples[1:])
    growth = {pid: samples[-1][pid] - samples[0][pid] for pid in sorted(common)}
    problems = [
        f"process {pid} grew by {kib} KiB (limit {RSS_GROWTH_LIMIT_KIB})"
        for pid, kib in growth.items()
        if kib > RSS_GROWTH_LIMIT_KIB
    ]
    if not growth:
        problems.append("no worker process lived through every RSS sample")
    return growth, problems


# -- bookings ------------------------------------------------------------------------


@contextlib.contextmanager
def runs_db(path: Path) -> Iterator[sqlite3.Connection]:
    """The soak's record of every run of its booking tool: its key and process."""
    _prepare_runs(path)
    db = sqlite3.connect(path, timeout=30.0)
    try:
        yield db
    finally:
        db.close()


#: The runs files this process has prepared.
_prepared: set[Path] = set()


def _prepare_runs(path: Path) -> None:
    """Create the runs file in WAL mode, once per process, under a lock file.

    As for the booking ledger (:func:`tasks.flights._prepare`): switching a file to WAL
    takes an exclusive lock SQLite does not wait for, so worker processes making their
    first runs at once would fail with "database is locked".
    """
    if path in _prepared and path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        db = sqlite3.connect(path, timeout=30.0)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE IF NOT EXISTS runs (idempotency_key TEXT, pid INTEGER)")
        finally:
            db.close()
    _prepared.add(path)


def ledger(path: Path, passenger_prefix: str) -> Counter[str]:
    """Bookings per soak passenger in the SQLite ledger at ``path``."""
    if not path.exists():
        return Counter()
    db = sqlite3.connect(path, timeout=30.0)
    try:
        rows = db.execute(
            "SELECT passenger FROM bookings WHERE passenger LIKE ?", (passenger_prefix + "%",)
        ).fetchall()
    finally:
        db.close()
    return Counter(passenger for (passenger,) in rows)


@dataclass(frozen=True)
class Reruns:
    """Idempotent calls whose body ran more than once, by why."""

    #: Every run but the last was in a pool process the soak SIGKILLed: the documented
    #: at-least-once re-run of a body cut off (the booking itself is keyed: one row).
    after_kill: int
    #: A body ran again although no kill cut the earlier run off: a bug.
    unexplained: int


def reruns(path: Path, killed: set[int]) -> Reruns:
    """Count the keys the booking tool ran more than once, from its run record."""
    if not path.exists():
        return Reruns(0, 0)
    with runs_db(path) as db:
        rows = db.execute("SELECT idempotency_key, pid FROM runs ORDER BY rowid").fetchall()
    pids: dict[str, list[int]] = {}
    for key, pid in rows:
        pids.setdefault(key, []).append(pid)
    after_kill = unexplained = 0
    for runs in pids.values():
        if len(runs) < 2:
            continue
        if all(pid in killed for pid in runs[:-1]):
            after_kill += 1
        else:
            unexplained += 1
    return Reruns(after_kill, unexplained)
