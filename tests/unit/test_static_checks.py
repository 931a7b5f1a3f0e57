"""mypy (strict), ruff's lint and ruff's format check pass on the whole project.

``.ci/run`` runs them again after the suite; run here too, and the run after it reads
mypy's cache. mypy runs with the tests marked ``alone`` (after the rest, one at a time):
beside five other test processes on two cores its cold start took over four minutes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "tool",
    [
        # mypy's cold start takes a core for a minute or more: it runs with the tests that
        # run alone, after the rest (pytest -m alone).
        pytest.param(["mypy"], id="mypy", marks=pytest.mark.alone),
        pytest.param(["ruff", "check", "."], id="ruff"),
        pytest.param(["ruff", "format", "--check", "."], id="ruff-format"),
    ],
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
