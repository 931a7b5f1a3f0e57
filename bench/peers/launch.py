"""Start the three peers on the benchmark's Redis and hand scenario 11 a side for each.

Each peer's worker is a process of its own that :meth:`Bench.process` starts with the
workers' environment and stops by PID; it is ready once a call through the peer's
client comes back. The clients live in the benchmark's process, the one client process
every side has; the asyncio ones (arq, taskiq) on the benchmark's event loop. They are
closed before their workers stop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Protocol

from bench.harness import Bench
from bench.peers import arq_app, dramatiq_app, taskiq_app
from bench.peers.calls import Side, async_calls, result_poll, sync_calls

__all__ = ["peers"]

#: Seconds a call may take in a measured block, and in a readiness probe.
_TIMEOUT = 120.0
_PROBE = 1.0


class _AsyncClient(Protocol):
    async def call(self, poll: float, timeout: float) -> object: ...

    async def aclose(self) -> None: ...


@contextlib.contextmanager
def peers(bench: Bench) -> Iterator[list[Side]]:
    """Start Dramatiq, arq and taskiq, each ready; stop them all at exit."""
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(_dramatiq(bench)),
            stack.enter_context(
                _asyncio_peer(
                    bench, "arq", arq_app.describe(), arq_app.Client.open, arq_app.worker_argv()
                )
            ),
            stack.enter_context(
                _asyncio_peer(
                    bench,
                    "taskiq",
                    taskiq_app.describe(),
                    taskiq_app.Client.open,
                    taskiq_app.worker_argv(),
                    stop_timeout=taskiq_app.STOP_TIMEOUT,
                )
            ),
        ]


@contextlib.contextmanager
def _dramatiq(bench: Bench) -> Iterator[Side]:
    from dramatiq.results import ResultTimeout  # Dramatiq imports gevent: only now

    client = dramatiq_app.Client(bench.url)
    try:

        def ready() -> bool:
            try:
                client.wait(client.send(), _PROBE)
            except ResultTimeout:
                return False
            return True

        with bench.process("dramatiq", dramatiq_app.worker_argv(), ready) as process:
            label, worker, how = dramatiq_app.describe()
            yield Side(
                label=label,
                kind="peer",
                worker=worker,
                client=how,
                pid=process.pid,
                calls=sync_calls(client.send, lambda message: client.wait(message, _TIMEOUT)),
            )
    finally:
        client.close()


@contextlib.contextmanager
def _asyncio_peer(
    bench: Bench,
    name: str,
    described: tuple[str, str, str],
    open_client: Callable[[str], Awaitable[_AsyncClient]],
    argv: list[str],
    *,
    stop_timeout: float = 10.0,
) -> Iterator[Side]:
    async def opened() -> _AsyncClient:
        return await open_client(bench.url)

    client = bench.run(opened())
    try:

        def ready() -> bool:
            try:
                bench.run(client.call(result_poll(1), _PROBE))
            except TimeoutError:  # arq's and taskiq's timeouts are TimeoutErrors
                return False
            return True

        def call_at(in_flight: int) -> Callable[[], Awaitable[object]]:
            poll = result_poll(in_flight)
            return lambda: client.call(poll, _TIMEOUT)

        with bench.process(name, argv, ready, stop_timeout=stop_timeout) as process:
            label, worker, how = described
            yield Side(
                label=label,
                kind="peer",
                worker=worker,
                client=how,
                pid=process.pid,
                calls=async_calls(bench.run, call_at),
            )
    finally:
        bench.run(client.aclose())
