"""``python -m bench.profile`` samples a real worker under load and prints where its time
goes per call, by thread and stage (bench/profile.py)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from .conftest import PROJECT_ROOT

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("pool", "thread"),
    [
        ("asyncio", "| main process | toolexec-asyncio |"),
        ("prefork", "| child process | (every child) |"),
    ],
)
def test_the_profile_gives_each_thread_its_time_per_call_by_stage(pool: str, thread: str) -> None:
    argv = [sys.executable, "-m", "bench.profile", "--pool", pool, "--in-flight", "20"]
    argv += ["--seconds", "2", "--rate", "100"]
    done = subprocess.run(
        argv, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=240, check=False
    )

    assert done.returncode == 0, done.stderr
    out = done.stdout
    calls = re.search(r": ([\d,]+) calls;", out)
    assert calls is not None and int(calls.group(1).replace(",", "")) > 0, out
    assert thread in out, out  # where this pool runs its calls
    row = next(line for line in out.splitlines() if line.startswith("| all |"))
    cells = [float(cell) for cell in row.strip("|").split("|")[2:]]
    assert cells[-1] > 0 and abs(sum(cells[:-1]) - cells[-1]) < 0.01, row
