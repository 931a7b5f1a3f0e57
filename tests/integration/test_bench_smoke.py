"""The benchmark suite's CI smoke run: ``python -m bench --smoke`` must not rot.

Only that it runs: exit status 0 and a table for each of the seven scenarios. Timings
on a CI machine prove nothing, so nothing here looks at a number.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PROJECT_ROOT = Path(__file__).resolve().parents[2]

HEADINGS = [
    "### 1. Sequential no-op round trip",
    "### 2. Throughput with 1, 10, 100 and 1,000 calls in flight",
    "### 3. Threads in the agent process",
    "### 4. Deadline fidelity",
    "### 5. Idempotent repeat (cache hit) against a dispatch",
    "### 6. Shedding",
    "### 7. Scaling",
]


@pytest.mark.timeout(600)
def test_the_smoke_run_prints_a_table_for_every_scenario_and_exits_0(tmp_path: Path) -> None:
    markdown = tmp_path / "benchmarks.md"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLEXEC_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "bench", "--smoke", "--markdown", str(markdown)],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = process.communicate(timeout=540)
    except subprocess.TimeoutExpired:
        # SIGTERM lets the benchmark stop the server and workers it started.
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
        pytest.fail(f"the smoke run did not finish in 540 s:\n{output[-5000:]}")
    assert process.returncode == 0, output[-5000:]
    for heading in HEADINGS:
        assert heading in output, f"missing {heading!r}:\n{output[-5000:]}"
        assert heading in markdown.read_text()
    assert "CRASHED" not in output
