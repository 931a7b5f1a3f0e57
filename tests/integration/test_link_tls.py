"""A client link to a TLS Redis leaves no socket open, however its connect is cut short.

Cancelled in its handshake (AUTH, HELLO), redis-py closes the new connection
gracefully and forgets it: TLS sends its goodbye and waits for the server's, a round
trip the loop of a closing client never makes, so that the collector finds the socket
open (``ResourceWarning: unclosed transport``). The link aborts it instead. Each round
here is a loop of its own that cancels one connect after a different delay, closes the
link as the client's I/O thread does and ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
import warnings
from collections.abc import Iterator

import pytest

from agent_client._io.link import Link, NotSent
from tests.integration.tls_support import make_tls_files
from toolexec.redis_server import RedisServer

pytestmark = pytest.mark.integration

#: Rounds: each cancels its connect after a different share of a whole connect's time,
#: from before the TCP connect to past the handshake.
ROUNDS = 40


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    tls = make_tls_files(tmp_path_factory.mktemp("tls"), require_client_certs=True)
    with RedisServer(directory=tmp_path_factory.mktemp("redis"), tls=tls).start() as started:
        yield started


def _one_round(url: str, delay: float) -> bool:
    """Cancel a connect after ``delay``, end the loop; whether the connect had completed."""
    loop = asyncio.new_event_loop()

    async def cut_short() -> bool:
        link = Link(url)
        task = asyncio.create_task(link.connect(timeout=5.0))
        await asyncio.sleep(delay)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, NotSent):
            await task
        connected = not task.cancelled() and task.exception() is None
        await link.close()
        return connected

    try:
        return loop.run_until_complete(cut_short())
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def _connect_time(url: str) -> float:
    async def connect() -> float:
        link = Link(url)
        started = time.perf_counter()
        await link.connect(timeout=5.0)
        took = time.perf_counter() - started
        await link.close()
        return took

    return min(asyncio.run(connect()) for _ in range(5))


def test_a_connect_cancelled_at_any_point_of_its_tls_handshake_leaves_no_socket_open(
    server: RedisServer,
) -> None:
    whole = _connect_time(server.url)
    completed = rounds = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for i in range(ROUNDS):
            completed += _one_round(server.url, whole * 1.5 * i / ROUNDS)
            rounds += 1
        # On a loaded machine a connect may take longer than the quiet one measured: the
        # delays go on doubling until one connect completes, so they span the whole of it.
        delay = whole * 1.5
        while not completed and delay < 10.0:
            delay *= 2
            completed += _one_round(server.url, delay)
            rounds += 1
        # once, at the end: a socket any round left open is reported as it is collected
        gc.collect()
    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]

    assert unclosed == []
    # The delays spanned the whole connect: some rounds cut it short, some let it finish.
    assert 0 < completed < rounds, (completed, rounds, whole)


def test_the_link_still_serves_commands_over_tls(server: RedisServer) -> None:
    async def ping() -> list[object]:
        link = Link(server.url)
        try:
            return await link.execute([("PING",)], timeout=5.0)
        finally:
            await link.close()

    assert asyncio.run(ping()) == [b"PONG"]
