"""A description of the machine and software a run measured, printed above the tables."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

__all__ = ["describe"]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    return "?"


def _commit(root: Path) -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return head + (" (with uncommitted changes)" if dirty else "")


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def describe(*, redis_version: str, root: Path) -> list[tuple[str, str]]:
    """(label, value) pairs: CPU, cores, memory, OS, Python, Redis and library versions."""
    return [
        ("CPU", _cpu_model()),
        ("cores", str(os.cpu_count())),
        ("memory", _memory()),
        ("OS", platform.platform()),
        ("Python", platform.python_version()),
        ("Redis server", redis_version),
        (
            "celery / kombu / redis-py",
            " / ".join(_version(p) for p in ("celery", "kombu", "redis")),
        ),
        ("lazybridge", _version("lazybridge")),
        (
            "dramatiq / arq / taskiq / taskiq-redis",
            " / ".join(_version(p) for p in ("dramatiq", "arq", "taskiq", "taskiq-redis")),
        ),
        # redis-py parses replies with hiredis (a dependency of toolexec) for every side.
        ("hiredis", _version("hiredis")),
        ("toolexec commit", _commit(root)),
    ]
