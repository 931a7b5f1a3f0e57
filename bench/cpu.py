"""CPU seconds a worker has used: its main process and its pool children, from the OS.

A worker's CPU per call is the difference of two readings around a block of calls,
divided by the calls. Each reading sums user and system time of the main process and
of every live child (psutil when installed, else Linux's ``/proc/<pid>/stat``). A child
that exits between the readings takes its time with it, so the blocks measured must not
retire pool processes (the benchmark's tools never do). :func:`cpu_split` keeps the two
apart, to show which process a side's time goes to.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CpuSplit", "children", "cpu_seconds", "cpu_split", "own_cpu"]

psutil: Any
try:  # psutil is optional (and untyped): a Linux /proc reading does the same
    psutil = importlib.import_module("psutil")
except ImportError:  # pragma: no cover - depends on the environment
    psutil = None


def cpu_seconds(pid: int | None) -> float:
    """User plus system seconds of ``pid`` and its live children; 0.0 if it is gone."""
    return cpu_split(pid).total


@dataclass(frozen=True)
class CpuSplit:
    """User plus system seconds of a process (``main``) and of its live children."""

    main: float = 0.0
    children: float = 0.0

    @property
    def total(self) -> float:
        return self.main + self.children

    def __sub__(self, earlier: CpuSplit) -> CpuSplit:
        return CpuSplit(self.main - earlier.main, self.children - earlier.children)


def cpu_split(pid: int | None) -> CpuSplit:
    """The CPU seconds of ``pid`` and of its live children, apart; zeros if it is gone."""
    if pid is None:
        return CpuSplit()
    return CpuSplit(own_cpu(pid), sum(own_cpu(child) for child in children(pid)))


def children(pid: int) -> list[int]:
    """PIDs of the live direct children of ``pid`` (a prefork worker's pool processes)."""
    if psutil is not None:
        try:
            return [
                c.pid for c in psutil.Process(pid).children() if c.status() != psutil.STATUS_ZOMBIE
            ]
        except psutil.Error:
            return []
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat_fields(stat)
        # Fields after the command name: state, ppid. A zombie ("Z") is already dead.
        if len(fields) > 1 and fields[0] not in ("Z", "X") and int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return sorted(found)


def own_cpu(pid: int) -> float:
    """User plus system seconds of ``pid`` alone (all its threads); 0.0 if it is gone."""
    if psutil is not None:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            return 0.0
        return float(times.user + times.system)
    fields = _stat_fields(Path(f"/proc/{pid}/stat"))
    if len(fields) < 13:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def _stat_fields(path: Path) -> list[str]:
    try:
        # The command name may hold spaces and parentheses: split after the last ")".
        return path.read_text().rpartition(")")[2].split()
    except OSError:
        return []
