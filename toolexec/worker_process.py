"""A real ``celery -A executor worker`` in its own process group, ready when it beats."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal, Self

import redis
from pydantic import ValidationError

from toolexec.process import POLL, _Process
from wire import keys
from wire.connect import sync_client
from wire.models import WorkerInfo
from wire.settings import Settings

__all__ = ["ASYNCIO_POOL", "Pool", "WorkerProcess", "celery_worker_argv", "pool_env"]

#: Celery's pools by their ``-P`` name, and ``"asyncio"``: toolexec's asyncio pool.
Pool = Literal["prefork", "solo", "threads", "asyncio"]

#: Where Celery finds the asyncio pool (``CELERY_CUSTOM_WORKER_POOL`` with ``-P custom``).
ASYNCIO_POOL = "executor.pools.asyncio_pool:AsyncioPool"


def pool_env(pool: Pool) -> dict[str, str]:
    """Environment variables the worker needs for ``pool``: Celery's custom pool for asyncio."""
    return {"CELERY_CUSTOM_WORKER_POOL": ASYNCIO_POOL} if pool == "asyncio" else {}


def celery_worker_argv(
    app: str,
    *,
    name: str,
    pool: Pool,
    concurrency: int,
    queues: Sequence[str],
    loglevel: str = "WARNING",
) -> list[str]:
    """The ``celery worker`` command line toolexec's launchers use, for Celery app ``app``.

    ``pool="asyncio"`` becomes ``-P custom``; run it with :func:`pool_env` in the environment.
    """
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        app,
        "worker",
        "-P",
        "custom" if pool == "asyncio" else pool,
        "-c",
        str(concurrency),
        "-Q",
        ",".join(queues),
        "-n",
        f"{name}@%h",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-l",
        loglevel,
    ]


class WorkerProcess(_Process):
    """A real ``celery -A executor worker`` in its own process group.

    The worker's settings come from ``os.environ`` updated with ``env``, exactly as the
    child sees them; readiness is its heartbeat (:class:`WorkerInfo` with the child's
    PID) under :func:`wire.keys.worker` in the Redis those settings name.

    Args:
        name: Node name; the worker runs as ``NAME@hostname``.
        pool: Celery execution pool, or ``"asyncio"``: toolexec's asyncio pool
            (:mod:`executor.pools`), started as ``-P custom`` with :func:`pool_env`.
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
        self.env = {**os.environ, **pool_env(pool), **(env or {})}
        self.cwd = Path(cwd) if cwd is not None else None
        self.loglevel = loglevel
        self.settings = Settings.from_env(self.env)
        self.info: WorkerInfo | None = None

    def argv(self) -> list[str]:
        """The command line that runs the worker."""
        return celery_worker_argv(
            "executor",
            name=self.name,
            pool=self.pool,
            concurrency=self.concurrency,
            queues=self.queues,
            loglevel=self.loglevel,
        )

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
        with sync_client(
            self.settings.redis_url, master=self.settings.sentinel_master, socket_connect_timeout=1
        ) as client:
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
                time.sleep(POLL)

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
