"""The tables the benchmark prints: measurements, then goals with PASS or MISS.

Everything renders as Markdown, which reads as well in a terminal as in
``docs/benchmarks.md``. A MISS is information for whoever optimises next; it never
changes the exit status.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "Figure",
    "Goal",
    "ScenarioResult",
    "Table",
    "count",
    "heading",
    "markdown_table",
    "ms",
    "rate",
    "ratio",
    "render",
]


@dataclass(frozen=True, kw_only=True)
class Table:
    """A measurement table: a header row and rows of already formatted cells."""

    columns: tuple[str, ...]
    rows: Sequence[Sequence[str]]


@dataclass(frozen=True, kw_only=True)
class Goal:
    """One goal of the issue, checked against this run.

    Attributes:
        name: What is compared, e.g. ``toolexec p50 / raw Celery p50``.
        measured: The value this run measured, formatted.
        target: The goal, formatted (``≤ 0.80×``).
        met: True (PASS), False (MISS) or None (not measured in this run).
    """

    name: str
    measured: str
    target: str
    met: bool | None

    @property
    def verdict(self) -> str:
        return "n/a" if self.met is None else "PASS" if self.met else "MISS"


@dataclass(frozen=True, kw_only=True)
class Figure:
    """The data of one picture, which ``python -m bench --plot DIR`` draws (bench/plots.py).

    Attributes:
        name: File name without extension (``DIR/<name>.png``).
        title: Title of the picture.
        kind: ``"lines"``: each series is (x, y) points, x numeric (drawn on a log
            scale); ``"bars"``: each series is (category, value) pairs, grouped by
            category.
        x_label: What the x axis (or the categories) shows.
        y_label: What the y axis shows.
        series: Series name -> its points, in order.
    """

    name: str
    title: str
    kind: Literal["lines", "bars"]
    x_label: str
    y_label: str
    series: dict[str, list[tuple[float | str, float]]]


@dataclass(kw_only=True)
class ScenarioResult:
    """What one scenario found."""

    number: int
    title: str
    tables: list[Table] = field(default_factory=list)
    goals: list[Goal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)


def heading(number: int, title: str) -> str:
    """The heading every scenario prints first (the smoke test looks for it)."""
    return f"### {number}. {title}"


def render(result: ScenarioResult) -> str:
    """The scenario as Markdown: heading, tables, goals, notes."""
    parts = [heading(result.number, result.title)]
    parts.extend(markdown_table(t.columns, t.rows) for t in result.tables)
    if result.goals:
        rows = [(g.name, g.measured, g.target, g.verdict) for g in result.goals]
        parts.append(markdown_table(("goal", "measured", "target", "result"), rows))
    if result.notes:
        parts.append("\n".join(f"- {note}" for note in result.notes))
    return "\n\n".join(parts) + "\n"


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table with padded columns, readable as plain text too."""
    widths = [max([len(str(c)), *(len(str(r[i])) for r in rows)]) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    separator = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(columns), separator, *(line(r) for r in rows)])


def ms(seconds: float) -> str:
    """Seconds as milliseconds with a precision that suits the size."""
    if math.isnan(seconds):
        return "–"
    value = seconds * 1000
    return (
        f"{value:.3f}" if abs(value) < 1 else f"{value:.2f}" if abs(value) < 100 else f"{value:.0f}"
    )


def ratio(value: float) -> str:
    """A ratio such as ``0.42×``."""
    return "–" if math.isnan(value) else f"{value:.2f}×"


def rate(per_second: float) -> str:
    """Calls per second."""
    return "–" if math.isnan(per_second) else f"{per_second:,.0f}"


def count(value: int) -> str:
    """An integer with thousands separators."""
    return f"{value:,}"
