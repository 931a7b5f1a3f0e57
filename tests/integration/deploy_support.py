"""What the deploy and outage tests share: a fleet on a Redis of the test's own, a batch
of calls with a fault in the middle, and the checks every such run must pass.

The tools (``tests/integration/deploy_tools.py``) write each start and end of a body to a
file per call (no Redis needed), so a run can be judged whatever was done to Redis:

* no body ran to its end twice, and no body started twice on processes that lived;
* no caller was told ``WorkerLost`` for a call whose body ran to its end;
* every call ended, typed (a result or a ``RemoteToolError``), within its deadline.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_client import RemoteToolError, ToolClient, WorkerLost, remote_tool, run_scope
from toolexec import Pool, RedisServer, WorkerProcess

__all__ = [
    "DEPLOY_MODULES",
    "QUEUE",
    "Batch",
    "Proxy",
    "deploy_env",
    "process_ids",
    "run_batch",
    "start_fleet",
]

#: The deploy tools' module and queue.
DEPLOY_MODULES = "tests.integration.deploy_tools"
QUEUE = "deploys"


def deploy_env(server: RedisServer | str, data: Path, **extra: str) -> dict[str, str]:
    """Worker and client settings for ``server`` (or a URL), with the deploy tools."""
    url = server if isinstance(server, str) else server.url
    return {
        "TOOLEXEC_BROKER_URL": url,
        "TOOLEXEC_REDIS_URL": url,
        "TOOLEXEC_DATA_DIR": str(data),
        "TOOLEXEC_HEARTBEAT_INTERVAL": "1",
        "TOOLEXEC_TOOL_MODULES": DEPLOY_MODULES,
        **extra,
    }


def process_ids(workers: Iterable[WorkerProcess]) -> set[int]:
    """Every pid of ``workers``: their main processes and pool children."""
    pids: set[int] = set()
    for worker in workers:
        if worker.pid is not None:
            pids |= {worker.pid, *worker.child_pids()}
    return pids


@dataclass
class Batch:
    """The calls of one run and what became of them."""

    outcomes: dict[str, Any]
    deadline: float
    took: dict[str, float]
    data: Path
    died: set[int] = field(default_factory=set)

    def runs(self, token: str) -> list[tuple[str, int]]:
        """Each (``start`` or ``end``, pid) of the call ``token``'s bodies, in order."""
        path = self.data / "runs" / token
        if not path.exists():
            return []
        return [
            (what, int(pid))
            for what, pid, _ in (line.split() for line in path.read_text().splitlines())
        ]

    def kinds(self) -> collections.Counter[str]:
        """How the calls ended: ``result`` or the error's type."""
        return collections.Counter(
            type(o).__name__ if isinstance(o, BaseException) else "result"
            for o in self.outcomes.values()
        )

    def ran(self, token: str) -> int:
        """How many of the call ``token``'s bodies ran to their end."""
        return sum(1 for what, _ in self.runs(token) if what == "end")

    def check(self, *, slack: float = 1.0) -> None:
        """The three promises of the module docstring, for every call of the batch."""
        problems = []
        for token, outcome in self.outcomes.items():
            runs = self.runs(token)
            ends = [pid for what, pid in runs if what == "end"]
            lived = [pid for what, pid in runs if what == "start" and pid not in self.died]
            if len(ends) > 1 or len(lived) > 1:
                problems.append(f"{token} ran twice: {runs}")
            if isinstance(outcome, WorkerLost) and ends:
                problems.append(f"{token} was told WorkerLost but ran to its end: {runs}")
            if not isinstance(outcome, dict | RemoteToolError):
                problems.append(f"{token} ended untyped: {outcome!r}")
            if self.took[token] > self.deadline + slack:
                problems.append(f"{token} ended {self.took[token]:.2f}s after it was sent")
        assert not problems, "\n".join(problems) + f"\nhow the calls ended: {dict(self.kinds())}"


def run_batch(
    client: ToolClient,
    tool: str,
    count: int,
    *,
    seconds: float,
    deadline: float,
    data: Path,
    fault: Callable[[], object] | None = None,
    at: float = 1.2,
    died: Callable[[], set[int]] = set,
) -> Batch:
    """Send ``count`` calls of ``tool`` at once (one run), do ``fault`` ``at`` seconds in
    (in a thread), and wait for every call; ``died()`` names the pids the fault killed."""
    proxy = remote_tool(tool, client=client, timeout=deadline)
    took: dict[str, float] = {}
    killed: set[int] = set()

    async def one(token: str) -> Any:
        started = time.monotonic()
        try:
            return await proxy.invoke({"token": token, "seconds": seconds})
        except RemoteToolError as exc:
            return exc
        finally:
            took[token] = time.monotonic() - started

    async def all_of_them() -> dict[str, Any]:
        tokens = [f"c{i}" for i in range(count)]
        calls = [asyncio.ensure_future(one(token)) for token in tokens]
        if fault is not None:
            await asyncio.sleep(at)
            killed.update(died())
            await asyncio.to_thread(fault)
        return dict(zip(tokens, await asyncio.gather(*calls), strict=True))

    with run_scope():
        outcomes = asyncio.run(all_of_them())
    return Batch(outcomes=outcomes, deadline=deadline, took=took, data=data, died=killed)


class Proxy:
    """A TCP proxy of the test's own to a server on 127.0.0.1, on a free port.

    :meth:`drop` aborts every connection through it (both ends see a reset, as when a
    network path fails); ``drop(half=True)`` half-closes them instead (each end's writes
    are shut down and nothing more reaches the other side).
    """

    def __init__(self, target_port: int) -> None:
        self._target = target_port
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        started = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(started,), daemon=True)
        self._thread.start()
        started.wait(10)
        assert self._server is not None
        self.port: int = self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        """The Redis URL through the proxy."""
        return f"redis://127.0.0.1:{self.port}/0"

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0)
        )
        started.set()
        self._loop.run_forever()
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.run_until_complete(self._server.wait_closed())
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target)
        except OSError:
            writer.close()
            return
        pair = (writer, up_writer)
        self._pairs.add(pair)
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self._pairs.discard(pair)

    def drop(self, *, half: bool = False) -> None:
        """Abort (or half-close) every connection through the proxy now."""
        done = threading.Event()

        def cut() -> None:
            for pair in list(self._pairs):
                for writer in pair:
                    if half:
                        sock = writer.get_extra_info("socket")
                        if sock is not None:
                            try:
                                sock.shutdown(socket.SHUT_WR)
                            except OSError:
                                pass
                    else:
                        writer.transport.abort()
            done.set()

        self._loop.call_soon_threadsafe(cut)
        done.wait(5)

    def close(self) -> None:
        """Stop the proxy and close every connection through it."""

        def stop() -> None:
            assert self._server is not None
            self._server.close()
            for pair in list(self._pairs):
                for writer in pair:
                    writer.transport.abort()
            self._loop.stop()

        self._loop.call_soon_threadsafe(stop)
        self._thread.join(10)


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(65_536):
            sink.write(data)
            await sink.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        sink.transport.abort()


def start_fleet(
    factory: Callable[..., WorkerProcess],
    env: Mapping[str, str],
    *,
    pool: Pool,
    count: int = 2,
    concurrency: int = 2,
) -> list[WorkerProcess]:
    """``count`` workers of ``pool`` on the deploy queue, each with ``concurrency``."""
    return [
        factory(pool=pool, concurrency=concurrency, queues=(QUEUE,), env=dict(env))
        for _ in range(count)
    ]
