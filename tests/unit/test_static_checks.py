"""mypy (strict), ruff's lint and ruff's format check pass on the whole project.

``.ci/run`` runs them again after the suite; run here too, mypy's cold start (half a
minute) overlaps the suite's other processes, and the run after it reads mypy's cache.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "tool",
    [["mypy"], ["ruff", "check", "."], ["ruff", "format", "--check", "."]],
    ids=["mypy", "ruff", "ruff-format"],
)
def test_the_static_checks_pass(tool: list[str]) -> None:
    run = subprocess.run(
        [sys.executable, "-m", *tool],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
