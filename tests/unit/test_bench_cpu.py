"""The benchmark's CPU readings put a process's time and its children's where they belong.

Scenario 2 splits each worker's CPU into its main process and its pool children
(:func:`bench.cpu.cpu_split`). A real parent process and a real child spin in turn here,
read both ways the module can read (psutil, and Linux's ``/proc`` without it).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import IO

import pytest

import bench.cpu
from bench.cpu import CpuSplit, cpu_seconds, cpu_split

#: CPU seconds the spinning process burns; the idle one stays well under a tenth of it.
SPIN = 0.4

#: Spins for SPIN seconds of its own CPU time.
_SPIN = f"""
import time
start = time.process_time()
while time.process_time() - start < {SPIN}:
    pass
"""

#: The child: waits for "go" on stdin, spins, says "spun", waits for stdin to close.
_CHILD = f"""
import sys
sys.stdin.readline()
{_SPIN}
print("spun", flush=True)
sys.stdin.read()
"""

#: The parent: starts the child (sharing its stdin and stdout), says "ready", then
#: either spins itself on "self" or passes "go" on to the child, and waits for it.
_PARENT = f"""
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", {_CHILD!r}], stdin=subprocess.PIPE)
print("ready", flush=True)
who = sys.stdin.readline().strip()
if who == "self":
{_SPIN.replace(chr(10), chr(10) + "    ")}
    print("spun", flush=True)
else:
    child.stdin.write(b"go\\n")
    child.stdin.flush()
sys.stdin.read()
child.stdin.close()
child.wait()
"""


@pytest.fixture(params=["psutil", "proc"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Read with psutil, or from ``/proc`` as when psutil is not installed."""
    if request.param == "proc":
        monkeypatch.setattr(bench.cpu, "psutil", None)
    else:
        assert bench.cpu.psutil is not None, "psutil is a test dependency"
    return str(request.param)


@pytest.fixture
def parent() -> Iterator[subprocess.Popen[str]]:
    with subprocess.Popen(
        [sys.executable, "-c", _PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as process:  # its exit closes both pipes and waits for it
        assert _line(process.stdout) == "ready"
        yield process


def _line(stream: IO[str] | None) -> str:
    assert stream is not None
    return stream.readline().strip()


def _spin(parent: subprocess.Popen[str], who: str) -> CpuSplit:
    """Have ``who`` ("self": the parent, "child") spin; the CPU split over the spin."""
    assert parent.stdin is not None
    before = cpu_split(parent.pid)
    parent.stdin.write(f"{who}\n")
    parent.stdin.flush()
    assert _line(parent.stdout) == "spun"
    return cpu_split(parent.pid) - before


@pytest.mark.parametrize(
    ("who", "busy", "idle"), [("child", "children", "main"), ("self", "main", "children")]
)
def test_cpu_time_is_counted_for_the_process_that_spent_it(
    reader: str, parent: subprocess.Popen[str], who: str, busy: str, idle: str
) -> None:
    spent = _spin(parent, who)

    assert getattr(spent, busy) >= SPIN * 0.9, (reader, spent)
    assert getattr(spent, idle) < SPIN / 4, (reader, spent)
    assert spent.total == pytest.approx(spent.main + spent.children)


def test_the_total_is_what_cpu_seconds_reads(reader: str, parent: subprocess.Popen[str]) -> None:
    _spin(parent, "child")
    split, total = cpu_split(parent.pid), cpu_seconds(parent.pid)

    # The idle pair barely moves between the two readings.
    assert total == pytest.approx(split.total, abs=0.05)
    assert total >= SPIN * 0.9


def test_no_process_reads_as_no_time(reader: str) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)

    assert cpu_split(None) == CpuSplit(0.0, 0.0)
    assert cpu_split(gone.pid) == CpuSplit(0.0, 0.0)
