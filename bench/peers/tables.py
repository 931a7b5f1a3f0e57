"""Scenario 11's tables and the issue's goals, from what the blocks measured.

The scenario (:mod:`bench.scenarios.peers`) hands over, by side: the kind of each side,
the sequential p50, the calls/s and CPU seconds per call at each level, and the
:class:`~bench.peers.usage.Usage` behind them. :func:`goals` checks the issue's goals:
at 100 and 1,000 calls in flight, toolexec's best pool against the fastest and the
leanest peer and the floor; one call at a time, each toolexec pool against raw Celery.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from bench.peers.calls import Kind
from bench.peers.usage import Usage
from bench.report import Goal, Table, count, ms, rate, ratio
from bench.stats import Latencies

__all__ = [
    "CPU_GOAL",
    "FLOOR_GOAL",
    "GOAL_LEVELS",
    "P50_GOAL",
    "RATE_GOAL",
    "ROLE_COLUMNS",
    "commands_table",
    "cpu_table",
    "goals",
    "rate_table",
    "roles_table",
    "sequential_table",
]

#: The levels of calls in flight the issue's goals are set at.
GOAL_LEVELS = (100, 1000)
#: The issue's goals: toolexec's best pool against the fastest peer's calls/s, the
#: leanest peer's CPU per call, raw Celery's sequential p50, and the floor's CPU.
RATE_GOAL = 1.25
CPU_GOAL = 0.8
P50_GOAL = 0.5
FLOOR_GOAL = 2.5


def _of(kinds: Mapping[str, Kind], kind: Kind) -> list[str]:
    return [label for label, k in kinds.items() if k == kind]


def goals(
    *,
    kinds: Mapping[str, Kind],
    p50: Mapping[str, float],
    rates: Mapping[int, Mapping[str, float]],
    cpu: Mapping[int, Mapping[str, float]],
) -> list[Goal]:
    """The issue's goals, PASS or MISS; a level this run did not measure is n/a.

    Args:
        kinds: Each side's label and kind.
        p50: Sequential p50 seconds by side.
        rates: Calls per second by level and side.
        cpu: CPU seconds per call, every process role together, by level and side.
    """
    toolexec, peer = _of(kinds, "toolexec"), _of(kinds, "peer")
    raw, floor = _of(kinds, "raw"), _of(kinds, "floor")
    found: list[Goal] = []
    for level in GOAL_LEVELS:
        at = f"at {level:,} in flight"
        if level not in rates:
            found += [
                Goal(name=name, measured="not run", target=target, met=None)
                for name, target in (
                    (f"toolexec's best pool / fastest peer, calls/s {at}", f"≥ {RATE_GOAL:.2f}×"),
                    (
                        f"toolexec's best pool / leanest peer, CPU per call {at}",
                        f"≤ {CPU_GOAL:.2f}×",
                    ),
                    (
                        f"toolexec's best pool / RPC floor, CPU per call {at}",
                        f"≤ {FLOOR_GOAL:.2f}×",
                    ),
                )
            ]
            continue
        fastest = max(rates[level][label] for label in toolexec) / max(
            rates[level][label] for label in peer
        )
        leanest = min(cpu[level][label] for label in toolexec)
        found += [
            _at_least(f"toolexec's best pool / fastest peer, calls/s {at}", fastest, RATE_GOAL),
            _at_most(
                f"toolexec's best pool / leanest peer, CPU per call {at}",
                leanest / min(cpu[level][label] for label in peer),
                CPU_GOAL,
            ),
            _at_most(
                f"toolexec's best pool / RPC floor, CPU per call {at}",
                leanest / cpu[level][floor[0]],
                FLOOR_GOAL,
            ),
        ]
    found += [
        _at_most(f"{label} sequential p50 / raw Celery p50", p50[label] / p50[raw[0]], P50_GOAL)
        for label in toolexec
    ]
    return found


def _at_least(name: str, value: float, target: float) -> Goal:
    return Goal(name=name, measured=ratio(value), target=f"≥ {target:.2f}×", met=value >= target)


def _at_most(name: str, value: float, target: float) -> Goal:
    return Goal(name=name, measured=ratio(value), target=f"≤ {target:.2f}×", met=value <= target)


def sequential_table(latencies: Mapping[str, Latencies], kinds: Mapping[str, Kind]) -> Table:
    raw = latencies[_of(kinds, "raw")[0]].p50
    return Table(
        columns=("side", "calls", "p50 ms", "p99 ms", "p50 vs raw Celery"),
        rows=[
            (label, count(len(lat)), ms(lat.p50), ms(lat.p99), ratio(lat.p50 / raw))
            for label, lat in latencies.items()
        ],
    )


def rate_table(
    block: Callable[[int], int],
    rates: Mapping[int, Mapping[str, float]],
    kinds: Mapping[str, Kind],
) -> Table:
    toolexec, peer = _of(kinds, "toolexec"), _of(kinds, "peer")
    rows = []
    for level, by in rates.items():
        fastest = max(peer, key=lambda label: by[label])
        best = max(by[label] for label in toolexec)
        rows.append(
            (
                f"{level:,}",
                count(block(level)),
                *(rate(by[label]) for label in kinds),
                fastest,
                ratio(best / by[fastest]),
            )
        )
    return Table(
        columns=(
            "in flight",
            "calls per block",
            *(f"{label} calls/s" for label in kinds),
            "fastest peer",
            "toolexec's best / fastest peer",
        ),
        rows=rows,
    )


def cpu_table(cpu: Mapping[int, Mapping[str, float]], kinds: Mapping[str, Kind]) -> Table:
    toolexec, peer = _of(kinds, "toolexec"), _of(kinds, "peer")
    floor = _of(kinds, "floor")[0]
    rows = []
    for level, by in cpu.items():
        leanest = min(peer, key=lambda label: by[label])
        best = min(by[label] for label in toolexec)
        rows.append(
            (
                f"{level:,}",
                *(f"{by[label] * 1e6:.0f}" for label in kinds),
                leanest,
                ratio(best / by[leanest]),
                ratio(best / by[floor]),
            )
        )
    return Table(
        columns=(
            "in flight",
            *(f"{label} CPU µs/call" for label in kinds),
            "leanest peer",
            "toolexec's leanest / leanest peer",
            "toolexec's leanest / floor",
        ),
        rows=rows,
    )


#: The columns of the table of CPU per call by process role (the smoke test reads it).
ROLE_COLUMNS = (
    "side",
    "in flight",
    "worker main process µs/call",
    "worker children µs/call",
    "client process µs/call",
    "Redis server µs/call",
    "all µs/call",
)


def roles_table(usage: Mapping[int, Mapping[str, Usage]]) -> Table:
    shown = [level for level in usage if level >= min(GOAL_LEVELS)] or [max(usage)]
    rows = [
        (
            label,
            f"{level:,}",
            *(f"{u.per_call(v) * 1e6:.0f}" for v in (u.main, u.children, u.client, u.redis, u.cpu)),
        )
        for level in shown
        for label, u in usage[level].items()
    ]
    return Table(columns=ROLE_COLUMNS, rows=rows)


def commands_table(usage: Mapping[int, Mapping[str, Usage]], labels: Sequence[str]) -> Table:
    return Table(
        columns=("in flight", *(f"{label} Redis commands/call" for label in labels)),
        rows=[
            (f"{level:,}", *(f"{by[label].per_call(by[label].commands):.2f}" for label in labels))
            for level, by in usage.items()
        ],
    )
