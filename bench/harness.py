"""The benchmark's private world: one Redis, the workers of every side, the clients.

:meth:`Bench.open` starts a private Redis server on a free port, a toolexec worker, a
plain Celery worker with the same pool and concurrency, and the hand-written RPC
server; it stops every one of them by PID when the ``with`` block ends, also on an
error. Scenarios start their own extra workers through :meth:`Bench.toolexec_workers`
and :meth:`Bench.raw_worker`, and any other process (the peers of scenario 11) through
:meth:`Bench.process`, which stop theirs the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any, Literal, Protocol, TypeVar

import celery.exceptions
import redis
from celery import Celery

import agent_client
from agent_client import RemoteTool, ToolClient, remote_tool
from bench import names, raw_celery
from bench.amqp import QUEUE_VARIABLE, AmqpQueues
from bench.redis_rpc import RpcClient, RpcTimeout
from bench.sizes import Sizes
from toolexec import (
    ChildProcess,
    Pool,
    ProcessStartFailed,
    RedisServer,
    WorkerProcess,
    celery_worker_argv,
)
from toolexec.worker_process import pool_env
from wire.settings import Settings

__all__ = ["PROJECT_ROOT", "Bench", "Options"]

PROJECT_ROOT = Path(__file__).resolve().parents[1]

T = TypeVar("T")

_READY_TIMEOUT = 60.0
#: Seconds a process has to exit on SIGTERM before its group is killed.
_STOP_TIMEOUT = 10.0


class _Stoppable(Protocol):
    def stop(self, timeout: float = 10.0) -> None: ...


@dataclass(frozen=True, kw_only=True)
class Options:
    """What a run measures: sample sizes, the shared worker pool and the broker."""

    sizes: Sizes
    pool: Pool = "prefork"
    concurrency: int = 2
    #: ``"amqp"``: calls and tasks travel over the machine's RabbitMQ (bench.amqp).
    broker: Literal["redis", "amqp"] = "redis"


class Bench:
    """Handles on everything a scenario needs; build it with :meth:`open`."""

    def __init__(self, options: Options, workdir: Path, stack: contextlib.ExitStack) -> None:
        self.options = options
        self.sizes = options.sizes
        self.logs = workdir / "logs"
        self.server = stack.enter_context(RedisServer(directory=workdir / "redis"))
        self.url = self.server.url
        #: The run's own queues on RabbitMQ with ``--broker amqp`` (deleted at the end), else None.
        self.amqp = AmqpQueues() if options.broker == "amqp" else None
        if self.amqp is not None:
            stack.callback(self.amqp.delete)  # last: after every worker stopped
        #: The queues of the shared toolexec and plain Celery workers.
        self.toolexec_queue = names.TOOLEXEC_QUEUE if self.amqp is None else self.amqp.toolexec
        self.raw_queue = names.RAW_QUEUE if self.amqp is None else self.amqp.raw
        #: The queue of a plain Celery worker with prefetch multiplier 1 (scenario 2 starts it).
        self.raw_prefetch1_queue = (
            names.RAW_PREFETCH1_QUEUE if self.amqp is None else self.amqp.raw_prefetch1
        )
        #: Environment of every worker: the private server and the benchmark's tools.
        self.env = {
            "TOOLEXEC_BROKER_URL": self.url if self.amqp is None else self.amqp.url,
            "TOOLEXEC_REDIS_URL": self.url,
            "TOOLEXEC_TOOL_MODULES": "bench.tools" if self.amqp is None else "bench.amqp_tools",
            "TOOLEXEC_DATA_DIR": str(workdir / "data"),
        }
        if self.amqp is not None:
            self.env[QUEUE_VARIABLE] = self.amqp.toolexec
        self.settings = Settings.from_env(self.env)
        self.redis = redis.Redis.from_url(self.url)
        stack.callback(self.redis.close)
        self.runner = stack.enter_context(asyncio.Runner())
        self.client: ToolClient = agent_client.configure(self.settings)
        stack.callback(self.client.close)
        self.celery: Celery = raw_celery.create_app(self.settings, queue=self.raw_queue)
        self.rpc = RpcClient(self.url)
        stack.callback(self.rpc.close)
        #: The shared workers :meth:`open` starts (their PIDs give their CPU time).
        self.shared_toolexec: WorkerProcess | None = None
        self.shared_raw: ChildProcess | None = None
        #: The hand-written RPC floor's server process (scenario 11 reads its CPU).
        self.rpc_server: ChildProcess | None = None

    @classmethod
    @contextlib.contextmanager
    def open(cls, options: Options) -> Iterator[Bench]:
        """Start the private server and the shared workers; stop them all at exit."""
        with TemporaryDirectory(prefix="toolexec-bench-") as tmp, contextlib.ExitStack() as stack:
            bench = cls(options, Path(tmp), stack)
            pool, concurrency = options.pool, options.concurrency
            (bench.shared_toolexec,) = stack.enter_context(
                bench.toolexec_workers([("toolexec", (bench.toolexec_queue,))], pool, concurrency)
            )
            bench.shared_raw = stack.enter_context(
                bench.raw_worker("raw", pool, concurrency, bench.raw_queue)
            )
            bench.rpc_server = stack.enter_context(bench._rpc_server())
            yield bench

    # -- processes -------------------------------------------------------------------

    @contextlib.contextmanager
    def toolexec_workers(
        self, workers: Sequence[tuple[str, Sequence[str]]], pool: Pool, concurrency: int
    ) -> Iterator[list[WorkerProcess]]:
        """Start one toolexec worker per (name, queues), wait for all, stop all at exit."""
        built = [
            WorkerProcess(
                name=name,
                pool=pool,
                concurrency=concurrency,
                queues=queues,
                env=self.env,
                cwd=PROJECT_ROOT,
                log_dir=self.logs,
            )
            for name, queues in workers
        ]
        with self.launched(built) as started:
            yield started

    @contextlib.contextmanager
    def launched(self, workers: Sequence[WorkerProcess]) -> Iterator[list[WorkerProcess]]:
        """Start ``workers`` (built with :attr:`env` in theirs), wait for all, stop all at exit."""
        started: list[WorkerProcess] = []
        try:
            for worker in workers:
                started.append(worker.start(wait=False))
            for worker in started:
                worker.wait_ready(_READY_TIMEOUT)
            yield started
        finally:
            _stop_all(started)

    @contextlib.contextmanager
    def raw_worker(
        self,
        name: str,
        pool: Pool,
        concurrency: int,
        queue: str,
        *,
        prefetch_multiplier: int | None = None,
    ) -> Iterator[ChildProcess]:
        """Start a plain Celery worker on ``queue``; return once it has run a task.

        ``prefetch_multiplier`` is Celery's ``--prefetch-multiplier``; Celery's default (4)
        when omitted.
        """
        argv = celery_worker_argv(
            "bench.raw_celery", name=name, pool=pool, concurrency=concurrency, queues=[queue]
        )
        if prefetch_multiplier is not None:
            argv += ["--prefetch-multiplier", str(prefetch_multiplier)]
        env = {**os.environ, **pool_env(pool), **self.env}  # -P custom needs the pool's path
        worker = ChildProcess(name, argv, env=env, cwd=PROJECT_ROOT, log_dir=self.logs)
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
    def process(
        self,
        name: str,
        argv: Sequence[str],
        ready: Callable[[], bool],
        *,
        stop_timeout: float = _STOP_TIMEOUT,
    ) -> Iterator[ChildProcess]:
        """Start ``argv`` with the workers' environment; return once ``ready()`` is true.

        ``ready`` makes one bounded attempt (a call with a short timeout) and says whether
        it went through; it is retried until the process is ready or has died. The
        process is stopped by PID at exit (the peers of scenario 11, the RPC floor):
        SIGTERM, then SIGKILL for its whole group after ``stop_timeout`` seconds.
        """
        env = {**os.environ, **self.env}
        process = ChildProcess(name, argv, env=env, cwd=PROJECT_ROOT, log_dir=self.logs)
        try:
            process.start()
            deadline = time.monotonic() + _READY_TIMEOUT
            while True:
                _check_alive(process, deadline)
                if ready():
                    break
            yield process
        finally:
            process.stop(stop_timeout)

    def _rpc_server(self) -> contextlib.AbstractContextManager[ChildProcess]:
        def ready() -> bool:
            try:
                self.rpc.call(timeout=0.5)
            except RpcTimeout:
                return False
            return True

        return self.process(
            "rpc-server", [sys.executable, "-m", "bench.redis_rpc", self.url], ready
        )

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
