"""The soak's report: how the calls ended, bookings, Redis keys, worker RSS, the verdict."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from bench.report import markdown_table
from bench.soak_checks import RSS_GROWTH_LIMIT_KIB, ErrorBounds, KeyCheck, Reruns

__all__ = ["Findings", "render"]


@dataclass
class Findings:
    """Everything the soak measured, and the problems that fail it."""

    command: str
    calls: int
    in_flight: int
    deadline: float
    took: float
    chaos: list[str]
    #: (tool, outcome) -> calls; outcome is "result" or the error's type name.
    outcomes: Counter[tuple[str, str]]
    never_ended: int
    samples: dict[str, str]  # error type -> one message
    bounds: ErrorBounds
    booked: int
    ledger: Counter[str]
    missing: int
    extra: int
    reruns: Reruns
    keys: KeyCheck
    waited: float | None  # seconds waited for the calls' keys to expire; None: no wait
    rss: dict[str, list[int]]  # when -> total KiB per worker
    growth: dict[int, int]  # pid -> KiB grown over the later phase
    later: list[dict[int, int]] = field(default_factory=list)  # pid -> KiB, each later sample
    problems: list[str] = field(default_factory=list)


def render(f: Findings) -> str:
    """The report as Markdown, ending in ``Result: PASS`` or ``Result: FAIL``."""
    kinds: Counter[str] = Counter()
    for (_, kind), n in f.outcomes.items():
        kinds[kind] += n
    ended = sum(kinds.values())
    out = [
        "# toolexec soak",
        "",
        (
            f"Command: `{f.command}`: {f.calls} calls, {f.in_flight} in flight, deadline "
            f"{f.deadline:g} s, took {f.took:.1f} s ({f.calls / f.took:.0f} calls/s)."
        ),
        "",
        "Disruptions: " + "; ".join(f.chaos) + ".",
        "",
        "## How the calls ended",
        "",
        markdown_table(
            ("outcome", "calls", "allowed", "why an error is allowed"),
            [_outcome_row(f.bounds, kind, n) for kind, n in sorted(kinds.items())]
            + [
                ("never ended", str(f.never_ended), "0", ""),
                ("total ended", str(ended), str(f.calls), ""),
            ],
        ),
        "",
        "By tool: "
        + ", ".join(f"{tool} {kind} {n}" for (tool, kind), n in sorted(f.outcomes.items()))
        + f". WorkerLost is allowed for: {', '.join(sorted(f.bounds.worker_lost_tools))}.",
        "",
        "## Bookings",
        "",
        markdown_table(
            ("check", "count"),
            [
                ("successful soak_book_flight calls", str(f.booked)),
                ("bookings in the ledger", str(sum(f.ledger.values()))),
                ("duplicate bookings", str(sum(n - 1 for n in f.ledger.values() if n > 1))),
                ("successful calls without a booking", str(f.missing)),
                ("bookings of calls that ended in an error", str(f.extra)),
                ("bodies run again after a SIGKILL cut them off", str(f.reruns.after_kill)),
                ("bodies run again with no kill to explain it", str(f.reruns.unexplained)),
            ],
        ),
        "",
        "## Redis keys"
        + (
            ""
            if f.waited is None
            else f" (after waiting {f.waited:.0f} s for the calls' keys to expire)"
        ),
        "",
        markdown_table(
            ("keys", "count"),
            [
                ("DBSIZE before the calls", str(f.keys.baseline)),
                ("DBSIZE after", str(f.keys.after)),
                (
                    (
                        "of the baseline's kinds (catalog, workers, heartbeats, the client's "
                        "liveness, kombu)"
                    ),
                    str(f.keys.baseline_kinds),
                ),
                (
                    "whose TTL rule outlives the wait (stats, dead letters, put-backs, run logs)",
                    str(f.keys.long_rule),
                ),
                ("of calls, left", str(f.keys.call_keys_left)),
                ("with a TTL longer than its rule", str(len(f.keys.over_rule))),
                ("without a TTL beyond the catalog and kombu's", str(len(f.keys.no_ttl))),
                ("of no known kind", str(len(f.keys.unexpected))),
            ],
        ),
        "",
        markdown_table(
            ("family", "keys", "largest TTL (s)", "rule (s)"),
            [
                (fam, str(n), str(ttl), f"{rule:g}")
                for fam, (n, ttl, rule) in f.keys.families.items()
            ],
        ),
        "",
        "## Worker RSS (KiB, main + pool processes)",
        "",
        markdown_table(
            ("when", *(f"worker {n + 1}" for n in range(len(next(iter(f.rss.values()), []))))),
            [(when, *map(str, values)) for when, values in f.rss.items()],
        ),
        "",
        (
            f"After the last restart, {len(f.growth)} processes sampled throughout grew by at most "
            f"{max(f.growth.values(), default=0)} KiB each (limit {RSS_GROWTH_LIMIT_KIB} KiB): "
            + "; ".join(
                f"pid {pid} " + " -> ".join(str(s.get(pid, "-")) for s in f.later)
                for pid in f.growth
            )
            + "."
        ),
        "",
    ]
    for name, message in sorted(f.samples.items()):
        out.append(f"One {name}: {message}")
        out.append("")
    if f.problems:
        out.append("Problems: " + "; ".join(f.problems) + ".")
        out.append("")
    out.append(f"Result: {'FAIL' if f.problems else 'PASS'}")
    return "\n".join(out)


def _outcome_row(bounds: ErrorBounds, kind: str, calls: int) -> tuple[str, str, str, str]:
    if kind == "result":
        return (kind, str(calls), "-", "")
    return (
        kind,
        str(calls),
        str(bounds.bounds.get(kind, 0)),
        bounds.reasons.get(kind, "no fault explains it"),
    )
