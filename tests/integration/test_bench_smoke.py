"""The benchmark suite's CI smoke run: ``python -m bench --smoke`` must not rot.

Only that it runs: exit status 0, a table for every scenario, and the figures drawn by
``--plot``. Timings on a CI machine prove nothing, so nothing here looks at a number.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.amqp import AMQP_SCENARIOS
from bench.peers.tables import GOAL_LEVELS, ROLE_COLUMNS
from bench.report import heading
from bench.scenarios import SCENARIOS
from bench.scenarios.throughput import USAGE_COLUMNS

pytestmark = pytest.mark.integration

PROJECT_ROOT = Path(__file__).resolve().parents[2]

#: Every scenario's heading, as the run prints it (a new scenario is checked too).
HEADINGS = [heading(scenario.NUMBER, scenario.TITLE) for scenario in SCENARIOS]

#: The figures the scenarios draw (``Figure.name``), each a PNG under ``--plot DIR``.
FIGURES = ("latency", "throughput")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_every_scenario_is_checked_for_its_heading() -> None:
    numbers = [scenario.NUMBER for scenario in SCENARIOS]

    assert numbers == list(range(1, len(SCENARIOS) + 1))
    assert len(HEADINGS) == len(SCENARIOS) >= 10


@pytest.mark.timeout(900)
def test_the_smoke_run_prints_a_table_for_every_scenario_draws_its_figures_and_exits_0(
    tmp_path: Path,
) -> None:
    markdown = tmp_path / "benchmarks.md"
    figures = tmp_path / "img"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLEXEC_")}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench",
            "--smoke",
            "--markdown",
            str(markdown),
            "--plot",
            str(figures),
        ],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = process.communicate(timeout=840)
    except subprocess.TimeoutExpired:
        # SIGTERM lets the benchmark stop the server and workers it started.
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
        pytest.fail(f"the smoke run did not finish in 840 s:\n{output[-5000:]}")
    assert process.returncode == 0, output[-5000:]
    written = markdown.read_text()
    for title in HEADINGS:
        assert title in output, f"missing {title!r}:\n{output[-5000:]}"
        assert title in written
    assert "CRASHED" not in output
    # Scenario 2 says where each side's time went: one row per side, a cell per process.
    lines = _squeezed(written)
    rows = _table(lines, USAGE_COLUMNS)
    assert rows is not None, f"no table of where the time went:\n{written[-3000:]}"
    assert len(rows) >= 5, rows  # toolexec, four raw Celery sides (and a second pool)
    for cells in rows:
        assert len(cells) == len(USAGE_COLUMNS) and all("% · " in c for c in cells[1:]), cells
    # Scenario 11: the peers beside toolexec, raw Celery and the floor, each side's CPU per
    # call by process role in numbers, and the goals with a verdict each.
    roles = _table(lines, ROLE_COLUMNS)
    assert roles is not None, f"no table of CPU per call by process role:\n{written[-3000:]}"
    sides = {cells[0].split()[0] for cells in roles}
    assert sides >= {"toolexec", "raw", "Dramatiq", "arq", "taskiq", "Redis"}, sides
    for cells in roles:
        assert all(c.isdigit() for c in cells[2:]), cells
    goal_rows = [line for line in lines if line.startswith("| 11 |")]  # the run's goals table
    verdicts = [line.rstrip(" |").rpartition(" ")[2] for line in goal_rows]
    assert len(goal_rows) == 3 * len(GOAL_LEVELS) + 2, goal_rows
    assert set(verdicts) <= {"PASS", "MISS", "n/a"} and {"PASS", "MISS"} & set(verdicts), goal_rows
    for name in FIGURES:
        png = figures / f"{name}.png"
        assert png.is_file(), f"{png} was not drawn:\n{output[-3000:]}"
        assert png.read_bytes()[:8] == PNG_SIGNATURE
        assert f"{name}.png" in written  # the page shows it
    assert sorted(p.name for p in figures.iterdir()) == sorted(f"{n}.png" for n in FIGURES)


def _table(lines: list[str], columns: tuple[str, ...]) -> list[list[str]] | None:
    """The cells of each row of the (squeezed) markdown table with these columns, or None."""
    header = next(
        (i for i, line in enumerate(lines) if line == "| " + " | ".join(columns) + " |"), None
    )
    if header is None:
        return None
    rows = itertools.takewhile(lambda line: line.startswith("|"), lines[header + 2 :])
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def _squeezed(text: str) -> list[str]:
    """Lines of a markdown page with each table cell's padding squeezed to one space."""
    return [" ".join(line.split()) for line in text.splitlines()]


def test_neither_the_benchmark_nor_toolexec_imports_gevent() -> None:
    # gevent monkey-patches the process that imports it; only the gevent-pool worker of
    # scenario 8 may (Celery's -P gevent). A fresh interpreter imports every scenario,
    # the harness, both sides and the worker app with the benchmark's tools. (greenlet,
    # which gevent brings, is imported by Celery itself when installed, for its
    # context-local stacks: celery.utils.threads; it patches nothing.)
    script = """
import json, sys
import agent_client, bench.cli, bench.harness, bench.scenarios, bench.tools, toolexec
from executor.seams.app import create_app
from wire.settings import Settings
create_app(
    Settings.from_env(
        {"TOOLEXEC_BROKER_URL": "redis://127.0.0.1:1/0"}, tool_modules=("bench.tools",)
    )
)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "gevent")))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLEXEC_")}
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


@pytest.mark.timeout(600)
def test_the_smoke_run_over_rabbitmq_prints_its_scenarios_and_exits_0() -> None:
    # The machine's RabbitMQ; the run's queues carry a token of their own (bench.amqp).
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLEXEC_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "bench", "--smoke", "--broker", "amqp"],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = process.communicate(timeout=540)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
        pytest.fail(f"the smoke run over RabbitMQ did not finish in 540 s:\n{output[-5000:]}")
    assert process.returncode == 0, output[-5000:]
    assert "CRASHED" not in output, output[-5000:]
    over_amqp = [h for s, h in zip(SCENARIOS, HEADINGS, strict=True) if s.NUMBER in AMQP_SCENARIOS]
    assert len(over_amqp) == len(AMQP_SCENARIOS) == 2
    for title in over_amqp:
        assert title in output, f"missing {title!r}:\n{output[-5000:]}"
    assert "RabbitMQ" in output  # the machine table names the broker
