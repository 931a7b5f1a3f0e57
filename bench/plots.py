"""``python -m bench --plot DIR``: draw the run's figures as PNG files with matplotlib.

Each scenario may hand over :class:`~bench.report.Figure` data with its tables: the
sequential round trip its latency percentiles per side (bars), the throughput scenario
its calls per second against calls in flight per side, with the workers' pool in each
line's name (lines, log scale). matplotlib is the ``bench`` extra
(``pip install toolexec[bench]``); it is imported only when pictures are asked for, and
draws off-screen (the Agg backend).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.report import Figure, ScenarioResult

__all__ = ["draw", "markdown_images"]

#: Size of every picture, in inches at :data:`_DPI`.
_SIZE = (8.0, 4.5)
_DPI = 110


def draw(results: Sequence[ScenarioResult], directory: Path) -> list[tuple[Figure, Path]]:
    """Draw every figure of ``results`` into ``directory``; the figures and their files."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    from matplotlib import pyplot

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for figure in (f for result in results for f in result.figures):
        fig, axes = pyplot.subplots(figsize=_SIZE, dpi=_DPI)
        try:
            if figure.kind == "bars":
                _bars(axes, figure)
            else:
                _lines(axes, figure)
            axes.set_title(figure.title)
            axes.set_ylabel(figure.y_label)
            axes.grid(axis="y", alpha=0.3)
            fig.tight_layout()
            path = directory / f"{figure.name}.png"
            fig.savefig(path)
        finally:
            pyplot.close(fig)
        written.append((figure, path))
    return written


def markdown_images(drawn: Sequence[tuple[Figure, Path]], markdown: Path) -> str:
    """A Markdown section showing ``drawn``, with paths relative to the ``markdown`` file."""
    if not drawn:
        return ""
    lines = ["## Figures", ""]
    for figure, path in drawn:
        relative = Path(os.path.relpath(path.resolve(), markdown.resolve().parent)).as_posix()
        lines += [f"![{figure.title}]({relative})", ""]
    return "\n".join(lines)


def _bars(axes: Any, figure: Figure) -> None:
    categories = list(dict.fromkeys(str(c) for points in figure.series.values() for c, _ in points))
    width = 0.8 / max(1, len(figure.series))
    for i, (label, points) in enumerate(figure.series.items()):
        values = {str(c): v for c, v in points}
        xs = [n + (i - (len(figure.series) - 1) / 2) * width for n in range(len(categories))]
        bars = axes.bar(xs, [values.get(c, 0.0) for c in categories], width, label=label)
        axes.bar_label(bars, fmt="%.2f", fontsize=7)
    axes.set_xticks(range(len(categories)), [_wrap(c) for c in categories], fontsize=8)
    axes.set_xlabel(figure.x_label)
    axes.legend()


def _lines(axes: Any, figure: Figure) -> None:
    ticks: set[float] = set()
    for label, points in figure.series.items():
        xs = [float(x) for x, _ in points]
        ticks.update(xs)
        axes.plot(xs, [y for _, y in points], marker="o", label=label)
    axes.set_xscale("log")
    axes.set_xticks(sorted(ticks), [f"{x:,.0f}" for x in sorted(ticks)])
    axes.minorticks_off()
    axes.set_xlabel(figure.x_label)
    axes.legend(fontsize=8)


def _wrap(text: str, width: int = 18) -> str:
    # Long side names on two or three lines under their bars.
    words, lines, line = text.split(), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "\n".join([*lines, line])
