"""One child process with its own process group and log file, stopped by PID.

The base of the private Redis servers and workers that the demo, the tests and the
benchmark start (:mod:`toolexec.redis_server`, :mod:`toolexec.worker_process`).
Nothing here ever signals a process it did not start.

Being a process launcher, this package passes ``os.environ`` through to its children;
the configuration it reads itself comes from :class:`~wire.settings.Settings`.
Errors are in :mod:`toolexec.errors`.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from toolexec.errors import ProcessStartFailed

__all__ = ["ChildProcess", "free_port"]

logger = logging.getLogger(__name__)

#: How often a launcher polls for readiness.
POLL = 0.05


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on at the moment of the call."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class _Process:
    """One subprocess with its output in a log file; stopped by PID."""

    _log_name = "process.log"

    def __init__(self, directory: str | Path | None) -> None:
        self._given_dir = Path(directory) if directory is not None else None
        self._own_dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def directory(self) -> Path:
        """Where the log (and, for Redis, the working files) live."""
        if self._given_dir is not None:
            return self._given_dir
        if self._own_dir is None:
            self._own_dir = Path(tempfile.mkdtemp(prefix="toolexec-"))
        return self._own_dir

    @property
    def log_path(self) -> Path:
        """The file that receives the process's stdout and stderr."""
        return self.directory / self._log_name

    @property
    def pid(self) -> int | None:
        """PID of the running process, or ``None``."""
        return self._proc.pid if self._proc is not None else None

    @property
    def is_running(self) -> bool:
        """Whether the process was started and has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the process's output."""
        return _tail(self.log_path, lines)

    def _spawn(self, argv: list[str], env: Mapping[str, str] | None, cwd: Path | None) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        logger.info("started %s (pid %d)", Path(argv[0]).name, self._proc.pid)

    def _signal(self, signum: int) -> None:
        assert self._proc is not None
        try:
            # start_new_session made the process the leader of its own group.
            os.killpg(self._proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def _terminate(self, timeout: float | None) -> None:
        """SIGTERM and wait up to ``timeout`` (``None``: no SIGTERM), then SIGKILL."""
        proc = self._proc
        if proc is None:
            return
        if timeout is not None and proc.poll() is None:
            # Only the leader gets SIGTERM: a Celery worker shuts its pool down itself.
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                logger.warning("pid %d ignored SIGTERM for %.1fs; killing it", proc.pid, timeout)
        # Also after a clean exit: nothing of the group may outlive its leader.
        self._signal(signal.SIGKILL)
        proc.wait()
        self._proc = None

    def _fail(self, message: str) -> ProcessStartFailed:
        tail = self.log_tail()
        self._terminate(None)
        return ProcessStartFailed(f"{message}; log {self.log_path}:\n{tail}")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; idempotent."""
        self._terminate(timeout)

    def kill(self) -> None:
        """SIGKILL at once, as a crash or a lost machine would."""
        self._terminate(None)

    def close(self) -> None:
        """Stop the process and remove the temporary directory, if one was made."""
        self.stop()
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
            self._own_dir = None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ChildProcess(_Process):
    """Any other command run the same way: own process group, log file, stopped by PID.

    Args:
        name: Names the log file (``NAME.log``) and the process in errors.
        argv: The command line.
        env: The child's whole environment.
        cwd: Its working directory.
        log_dir: Where its output goes; a temporary one when omitted.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        log_dir: str | Path | None = None,
    ) -> None:
        super().__init__(log_dir)
        self._log_name = f"{name}.log"
        self.name = name
        self.argv = list(argv)
        self.env = dict(env) if env is not None else None
        self.cwd = Path(cwd) if cwd is not None else None

    def start(self) -> Self:
        """Start the process; returns at once (no-op if it runs)."""
        if not self.is_running:
            self._spawn(self.argv, self.env, self.cwd)
        return self

    def __enter__(self) -> Self:
        return self.start()
