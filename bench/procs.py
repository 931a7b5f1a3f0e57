"""Child processes that are not toolexec workers: the plain Celery worker, the RPC server.

toolexec workers are started with :class:`executor.launch.WorkerProcess`; these use the
same rules: each child leads its own process group, writes to a log file, and is
stopped by its PID (SIGTERM to the leader, then SIGKILL to the group).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

from executor.launch import Pool

__all__ = ["ChildProcess", "celery_worker_argv"]


def celery_worker_argv(
    app: str, *, name: str, pool: Pool, concurrency: int, queues: Sequence[str]
) -> list[str]:
    """``celery worker`` command line, with the flags :class:`WorkerProcess` uses."""
    return [
        sys.executable, "-m", "celery", "-A", app, "worker",
        "-P", pool, "-c", str(concurrency), "-Q", ",".join(queues),
        "-n", f"{name}@%h", "--without-gossip", "--without-mingle",
        "--without-heartbeat", "-l", "WARNING",
    ]  # fmt: skip


class ChildProcess:
    """One subprocess in its own process group, logging to ``log_dir/NAME.log``."""

    def __init__(
        self, name: str, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, log_dir: Path
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = {**os.environ, **env}
        self.cwd = cwd
        self.log_path = log_dir / f"{name}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """PID of the running process, or ``None``."""
        return self._proc.pid if self._proc is not None else None

    @property
    def is_running(self) -> bool:
        """Whether the process was started and has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Self:
        """Start the process; returns at once."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=self.env, cwd=self.cwd, start_new_session=True,
            )  # fmt: skip
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the leader, wait up to ``timeout``, then SIGKILL the whole group."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout)
        # start_new_session made the child the leader of a group with its own PID.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the process's output."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])
