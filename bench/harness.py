"""The benchmark's private world: one Redis, the workers of every side, the clients.

:meth:`Bench.open` starts a private Redis server on a free port, a toolexec worker, a
plain Celery worker with the same pool and concurrency, and the hand-written RPC
server; it stops every one of them by PID when the ``with`` block ends, also on an
error. Scenarios start their own extra workers through :meth:`Bench.toolexec_workers`
and :meth:`Bench.raw_worker`, which stop theirs the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Coroutine, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any, Protocol, TypeVar

import celery.exceptions
import redis
from celery import Celery

import agent_client
from agent_client import RemoteTool, ToolClient, remote_tool
from bench import names, raw_celery
from bench.redis_rpc import RpcClient, RpcTimeout
from bench.sizes import Sizes
from executor.launch import (
    ChildProcess,
    Pool,
    ProcessStartFailed,
    RedisServer,
    WorkerProcess,
    celery_worker_argv,
)
from executor.settings import Settings

__all__ = ["PROJECT_ROOT", "Bench", "Options"]

PROJECT_ROOT = Path(__file__).resolve().parents[1]

T = TypeVar("T")

_READY_TIMEOUT = 60.0


class _Stoppable(Protocol):
    def stop(self, timeout: float = 10.0) -> None: ...


@dataclass(frozen=True, kw_only=True)
class Options:
    """What a run measures: sample sizes and the shared worker pool."""

    sizes: Sizes
    pool: Pool = "prefork"
    concurrency: int = 2


class Bench:
    """Handles on everything a scenario needs; build it with :meth:`open`."""

    def __init__(self, options: Options, workdir: Path, stack: contextlib.ExitStack) -> None:
        self.options = options
        self.sizes = options.sizes
        self.logs = workdir / "logs"
        self.server = stack.enter_context(RedisServer(directory=workdir / "redis"))
        self.url = self.server.url
        #: Environment of every worker: the private server and the benchmark's tools.
        self.env = {
            "TOOLEXEC_BROKER_URL": self.url,
            "TOOLEXEC_REDIS_URL": self.url,
            "TOOLEXEC_TOOL_MODULES": "bench.tools",
            "TOOLEXEC_DATA_DIR": str(workdir / "data"),
        }
        self.settings = Settings.from_env(self.env)
        self.redis = redis.Redis.from_url(self.url)
        stack.callback(self.redis.close)
        self.runner = stack.enter_context(asyncio.Runner())
        self.client: ToolClient = agent_client.configure(self.settings)
        stack.callback(self.client.close)
        self.celery: Celery = raw_celery.create_app(self.settings)
        self.rpc = RpcClient(self.url)
        stack.callback(self.rpc.close)

    @classmethod
    @contextlib.contextmanager
    def open(cls, options: Options) -> Iterator[Bench]:
        """Start the private server and the shared workers; stop them all at exit."""
        with TemporaryDirectory(prefix="toolexec-bench-") as tmp, contextlib.ExitStack() as stack:
            bench = cls(options, Path(tmp), stack)
            pool, concurrency = options.pool, options.concurrency
            stack.enter_context(
                bench.toolexec_workers([("toolexec", (names.TOOLEXEC_QUEUE,))], pool, concurrency)
            )
            stack.enter_context(bench.raw_worker("raw", pool, concurrency, names.RAW_QUEUE))
            stack.enter_context(bench._rpc_server())
            yield bench

    # -- processes -------------------------------------------------------------------

    @contextlib.contextmanager
    def toolexec_workers(
        self, workers: Sequence[tuple[str, Sequence[str]]], pool: Pool, concurrency: int
    ) -> Iterator[list[WorkerProcess]]:
        """Start one toolexec worker per (name, queues), wait for all, stop all at exit."""
        started: list[WorkerProcess] = []
        try:
            for name, queues in workers:
                worker = WorkerProcess(
                    name=name, pool=pool, concurrency=concurrency, queues=queues,
                    env=self.env, cwd=PROJECT_ROOT, log_dir=self.logs,
                )  # fmt: skip
                started.append(worker.start(wait=False))
            for worker in started:
                worker.wait_ready(_READY_TIMEOUT)
            yield started
        finally:
            _stop_all(started)

    @contextlib.contextmanager
    def raw_worker(
        self, name: str, pool: Pool, concurrency: int, queue: str
    ) -> Iterator[ChildProcess]:
        """Start a plain Celery worker on ``queue``; return once it has run a task."""
        argv = celery_worker_argv(
            "bench.raw_celery", name=name, pool=pool, concurrency=concurrency, queues=[queue]
        )
        worker = ChildProcess(name, argv, env={**os.environ, **self.env}, cwd=PROJECT_ROOT, log_dir=self.logs)
        try:
            worker.start()
            deadline = time.monotonic() + _READY_TIMEOUT
            while True:
                _check_alive(worker, deadline)
                try:
                    self.celery.send_task(raw_celery.NOOP, queue=queue).get(timeout=1.0)
                    break
                except celery.exceptions.TimeoutError:
                    continue
            yield worker
        finally:
            _stop_all([worker])

    @contextlib.contextmanager
    def _rpc_server(self) -> Iterator[ChildProcess]:
        argv = [sys.executable, "-m", "bench.redis_rpc", self.url]
        server = ChildProcess("rpc-server", argv, env={**os.environ, **self.env}, cwd=PROJECT_ROOT, log_dir=self.logs)
        try:
            server.start()
            deadline = time.monotonic() + _READY_TIMEOUT
            while True:
                _check_alive(server, deadline)
                try:
                    self.rpc.call(timeout=0.5)
                    break
                except RpcTimeout:
                    continue
            yield server
        finally:
            _stop_all([server])

    # -- calling -------------------------------------------------------------------

    def tool(self, name: str) -> RemoteTool:
        """A proxy for the benchmark tool ``name`` on this run's client."""
        return remote_tool(name, client=self.client)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the benchmark's one event loop."""
        return self.runner.run(coroutine)

    def wait_idle(self, queues: Sequence[str], timeout: float = 60.0, settle: float = 0.2) -> None:
        """Wait until ``queues`` are empty, then ``settle`` seconds for what is running."""
        deadline = time.monotonic() + timeout
        while any(self.redis.llen(q) for q in queues):
            if time.monotonic() > deadline:
                raise TimeoutError(f"queues {list(queues)} still hold messages after {timeout}s")
            time.sleep(0.05)
        time.sleep(settle)

    def redis_version(self) -> str:
        """Version of the private server."""
        return str(self.redis.info("server").get("redis_version", "?"))


def _check_alive(process: ChildProcess, deadline: float) -> None:
    if not process.is_running:
        raise ProcessStartFailed(
            f"{process.name} exited during start; log {process.log_path}:\n{process.log_tail()}"
        )
    if time.monotonic() > deadline:
        raise ProcessStartFailed(
            f"{process.name} was not ready in time; log {process.log_path}:\n{process.log_tail()}"
        )


def _stop_all(processes: Sequence[_Stoppable]) -> None:
    # In parallel: a prefork worker takes seconds to shut its pool down.
    if not processes:
        return
    with ThreadPoolExecutor(max_workers=len(processes), thread_name_prefix="bench-stop") as pool:
        for future in [pool.submit(p.stop, 10.0) for p in processes]:
            future.result()
