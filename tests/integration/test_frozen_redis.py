"""Deadlines hold whatever Redis does: a frozen Redis holds no caller past its deadline
and stalls no event loop, the caller's or the client's own.

Each test runs a Redis of its own (``outage_support.py``) and freezes it with
``SIGSTOP``, by its PID: connections stay open and nothing is answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import TYPE_CHECKING

import pytest
import redis

import wire.clock
from agent_client import (
    BrokerUnavailable,
    RemoteTool,
    RemoteToolError,
    ToolClient,
    ToolOutcomeUnknown,
    remote_tool,
)
from agent_client.clock import RETRY_AFTER
from tests.redis_stats import calls_of
from toolexec import RedisServer
from wire.settings import Settings

from .outage_support import SLACK, echo_works, freeze, frozen, thaw
from .polling import wait_until

if TYPE_CHECKING:
    from .conftest import WorkerFactory

pytestmark = pytest.mark.integration


def test_a_frozen_redis_never_holds_a_sync_caller_past_its_deadline(
    own_server: RedisServer,
    worker_factory: WorkerFactory,
    own_env: dict[str, str],
    own_client: ToolClient,
) -> None:
    worker_factory(pool="prefork", concurrency=2, env=own_env)
    echo = remote_tool("probe_echo", timeout=0.5, client=own_client)
    assert echo(text="warm", number=0)["text"] == "warm"

    with frozen(own_server):
        lateness, errors = [], []
        for number in range(3):
            started = time.monotonic()
            with pytest.raises(RemoteToolError) as raised:
                echo(text="frozen", number=number)
            lateness.append(time.monotonic() - started - 0.5)
            errors.append(raised.value)
        # Building a proxy reads the catalog: bounded too. A tool the last read saw
        # served is built from that read; one it never saw is said to be Redis' fault.
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable):
            remote_tool("probe_never_published", client=own_client)
        catalog_wait = time.monotonic() - started
        assert remote_tool("probe_echo", client=own_client).spec == echo.spec

    assert all(0 <= late <= SLACK for late in lateness), lateness
    # The first was written and never answered; the next ones waited behind it for a
    # connection that never came, so they were not sent (and say so).
    assert isinstance(errors[0], ToolOutcomeUnknown), errors
    assert all(isinstance(e, ToolOutcomeUnknown | BrokerUnavailable) for e in errors), errors
    assert catalog_wait <= 2.0 + SLACK, f"the catalog read took {catalog_wait:.2f}s"
    # Redis awake: the same proxy works again.
    assert wait_until(lambda: echo_works(echo), timeout=10)


def test_an_asyncio_callers_loop_and_the_clients_io_loop_keep_ticking_while_redis_is_frozen(
    own_server: RedisServer,
    worker_factory: WorkerFactory,
    own_env: dict[str, str],
    own_client: ToolClient,
    own_store: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker_factory(pool="prefork", concurrency=2, env=own_env)
    spec = own_client.catalog.spec("probe_echo")
    # An agent process that has not measured its offset to Redis' clock yet: its client
    # tries to during the freeze, on its I/O loop, beside the catalog reads the calls kick.
    unmeasured = wire.clock.SharedClock()
    monkeypatch.setattr(wire.clock, "shared_clock", unmeasured)
    agent = ToolClient(Settings.from_env(own_env))
    echo = RemoteTool(spec, timeout=1.0, client=agent)
    times_asked = calls_of(own_store, "time")
    try:
        worst_gaps, waits = asyncio.run(_waves_of_calls_while_frozen(own_server, agent, echo))
        assert wait_until(lambda: calls_of(own_store, "time") > times_asked, timeout=5), (
            "no TIME was tried"
        )
        tried = calls_of(own_store, "time") - times_asked
        measured_while_frozen = unmeasured.offset
        # Awake: the next try, no sooner than RETRY_AFTER after the first, measures it.
        assert wait_until(
            lambda: echo_works(echo) and unmeasured.offset is not None, timeout=RETRY_AFTER + 5
        )
    finally:
        agent.close()

    # A blocking Redis command on a loop stalls it for its whole socket timeout (0.25 s
    # for a TIME, seconds for the rest: 258 ms seen with one sync TIME put back); the
    # bound leaves room for a loaded machine's scheduling (up to 214 ms seen at load 4).
    for where, gap in worst_gaps.items():
        assert gap < 0.2, f"the {where} stood still for {gap * 1000:.0f} ms"
    # Each call hears its deadline on the caller's loop: as late as SLACK, and as late again
    # as the machine left that loop standing still (its ticker's worst gap past its 5 ms
    # sleep; at a load of 8, a loop unscheduled for 56 ms made a call hear 56 ms late).
    stood_still = max(0.0, worst_gaps["caller's event loop"] - 0.005)
    assert all(1.0 - 0.01 <= w <= 1.0 + SLACK + stood_still for w in waits), (
        sorted(waits)[-3:],
        worst_gaps,
    )
    # One try while frozen (it gave up at its first TIME), none again within RETRY_AFTER.
    assert 1 <= tried <= unmeasured.samples, tried
    assert measured_while_frozen is None


async def _waves_of_calls_while_frozen(
    server: RedisServer, agent: ToolClient, echo: RemoteTool
) -> tuple[dict[str, float], list[float]]:
    """Waves of 20 calls while ``server`` is frozen; the worst gaps of a ticker on this
    loop and on the client's I/O loop, and how long each call waited."""
    gaps: dict[str, list[float]] = {"caller's event loop": [], "client's I/O loop": []}
    stop = threading.Event()

    async def ticker(into: list[float]) -> None:
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.005)
            now = time.monotonic()
            into.append(now - last)
            last = now

    async def timed(i: int) -> float:
        started = time.monotonic()
        with contextlib.suppress(RemoteToolError):
            await echo.run(text="frozen", number=i)
        return time.monotonic() - started

    ticking = asyncio.ensure_future(ticker(gaps["caller's event loop"]))
    io_ticking = agent.io.submit(lambda: ticker(gaps["client's I/O loop"]))
    freeze(server)
    try:
        # Calls in waves, so that sends, waits and deadlines overlap the whole time.
        waits: list[float] = []
        for wave in range(3):
            waits += await asyncio.gather(*(timed(wave * 20 + i) for i in range(20)))
            await asyncio.sleep(0.1)
    finally:
        thaw(server)
    stop.set()
    await ticking
    await asyncio.wrap_future(io_ticking)
    return {where: max(found) for where, found in gaps.items()}, waits
