"""The fault schedule at a small size: ``python -m bench chaos`` finds no broken promise.

Two seeds of 15 s each: real workers on prefork, threads and asyncio, two caller
processes, and a seeded random fault every 1.5 to 4 s, drawn from every fault the bench
knows (worker SIGKILL, SIGTERM, SIGQUIT; Redis paused, restarted without its data, full;
every connection dropped; a caller SIGKILLed; poison). The bench runs many more seeds
(``python -m bench chaos``).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.integration.conftest import PROJECT_ROOT

pytestmark = pytest.mark.integration


# Seeds whose schedules, together, draw every fault (the draws are the seed's; their
# count depends on how long each fault takes).
@pytest.mark.parametrize("seed", [202, 221, 349])
def test_a_seeded_schedule_of_faults_breaks_no_promise(seed: int) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "chaos",
            "--first-seed",
            str(seed),
            "--seeds",
            "1",
            "--seconds",
            "15",
        ],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-3000:]
    assert "0 violations" in run.stdout
    assert "faults:" in run.stdout and " calls (" in run.stdout
