"""What a call costs the one Redis every agent and worker shares, counted by the server.

A real ``celery worker`` (solo pool: the stats of a prefork child would flush on their
own every second) and a real client run calls against a Redis of their own, and
``INFO commandstats`` is read before and after a block of them. Commands a Lua script
runs count, and so does the script call (``EVALSHA``). The counts are deterministic,
unlike timings, so they are asserted exactly:

* one call at a time, every command of a call, by name: the client's send (a script
  that claims or marks the call and pushes its message), the worker's ``BRPOP``, begin
  (idempotent only: ``SET NX`` of the key's state) and complete (``SET ... GET`` of the
  stored outcome, ``RPUSH`` and ``EXPIRE`` of the reply), and the client's read of its
  reply list (``LTRIM``, ``BLMOVE``, ``LRANGE``);
* 100 calls in flight: what each call costs on its own, and that the client's script
  and ``LPUSH`` are shared by every call of a batch (``python -m bench --only 9``
  measures the rest, the amortised reads, against the goal of 8).

Each reading is taken with both sides parked (the worker blocked in ``BRPOP``, the
client's listener in ``BLMOVE``), so every block counts whole calls. A block in which
the worker's heartbeat beat, or the client re-read its catalog view (at most once a
second), is measured again: that is background, not the call.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any

import pytest
import redis

from agent_client import RemoteTool, ToolClient, remote_tool, run_scope
from tests.redis_stats import commands
from toolexec import RedisServer, WorkerProcess
from wire import keys
from wire.settings import Settings

from .conftest import PROJECT_ROOT
from .polling import wait_until

pytestmark = pytest.mark.integration

#: Calls per block, one at a time, and in flight at once.
SEQUENTIAL, IN_FLIGHT, CONCURRENT = 20, 100, 300
#: Blocks tried before giving up on one free of background work.
ATTEMPTS = 8
#: The worker's heartbeat (its pipeline's SADD) and the client's catalog read.
BEAT = "sadd"
#: A catalog read also looks for the client's own liveness key beside it (its EXISTS:
#: agent_client/_io/writes.py), so that a read just after a Redis restart proves no death.
CATALOG_READ = frozenset({"hgetall", "smembers", "exists", "mget", "srem", "time"})

#: Every command of one call sent alone, by name.
PLAIN = {
    "evalsha": 1, "set": 1, "lpush": 1,  # PUSH_ONCE: the sent marker, the message
    "brpop": 1, "rpush": 1, "expire": 1,  # the worker: take it, push the reply
    "ltrim": 1, "blmove": 1, "lrange": 1,  # the client's read of its reply list
}  # fmt: skip
IDEMPOTENT = {
    # CLAIM: the claim and the message; the worker's begin (SET NX of the key's state)
    # and complete (SET the stored outcome, GET what it replaces): three SETs in all.
    "evalsha": 1, "set": 3, "lpush": 1,
    "brpop": 1, "rpush": 1, "expire": 1,  # the worker: take it, push the reply
    "ltrim": 1, "blmove": 1, "lrange": 1,  # the client's read of its reply list
}  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A Redis of its own: nothing but this worker and this client sends it a command."""
    with RedisServer(directory=tmp_path_factory.mktemp("counted-redis")) as server:
        yield server


@pytest.fixture(scope="module")
def env(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {
        "TOOLEXEC_BROKER_URL": server.url,
        "TOOLEXEC_REDIS_URL": server.url,
        "TOOLEXEC_DATA_DIR": str(tmp_path_factory.mktemp("counted-data")),
        # A beat every 20 s: seldom inside a block (and a block with one is measured again).
        "TOOLEXEC_HEARTBEAT_INTERVAL": "60",
        "TOOLEXEC_TOOL_MODULES": "tests.integration.count_tools",
        # The call's own commands: what the run log adds is counted by
        # test_run_view.py::test_the_run_log_costs_one_xadd_per_call_on_each_side.
        "TOOLEXEC_RUN_LOG": "off",
    }


@pytest.fixture(scope="module")
def worker(
    env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    worker = WorkerProcess(
        name=f"counted-{uuid.uuid4().hex[:8]}",
        pool="solo",
        concurrency=1,
        queues=("counted",),
        env=env,
        cwd=PROJECT_ROOT,
        log_dir=tmp_path_factory.mktemp("counted-worker"),
    )
    with worker.start():
        yield worker


@pytest.fixture(scope="module")
def client(env: dict[str, str], worker: WorkerProcess) -> Iterator[ToolClient]:
    client = ToolClient(Settings.from_env(env))
    yield client
    client.close()


@pytest.fixture(scope="module")
def store(server: RedisServer) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(server.url) as connection:
        yield connection


def parked(store: redis.Redis) -> Counter[str]:
    """:func:`commands`, read once the worker waits in ``BRPOP`` and the listener in ``BLMOVE``."""
    assert wait_until(lambda: store.info("clients")["blocked_clients"] == 2, timeout=10.0), (
        "the worker and the client's listener never both waited"
    )
    return commands(store)


def count_block(
    store: redis.Redis, block: Callable[[], Coroutine[Any, Any, None]], *, catalog_reads: bool
) -> Counter[str]:
    """The commands of one ``block`` of calls, measured again while background work fell
    into it: a heartbeat, the client's liveness beat (its ``SET``), or (unless
    ``catalog_reads``, whose names are then left out) a read of the client's catalog
    view."""
    counts: Counter[str] = Counter()
    for _ in range(ATTEMPTS):
        with run_scope():  # one run; every idempotent call still has a key of its own
            lives = caller_lives(store)  # read first: its own commands fall before the block's
            before = parked(store)
            asyncio.run(block())
            counts = parked(store) - before
        read = {name for name in counts if name in CATALOG_READ}
        client_beat = _written_since(lives, caller_lives(store))  # the client's liveness beat
        if counts[BEAT] == 0 and not client_beat and (catalog_reads or not read):
            for name in read:
                del counts[name]
            return counts
    pytest.fail(f"no block of calls without background work in {ATTEMPTS} tries: {dict(counts)}")


def caller_lives(store: redis.Redis) -> dict[bytes, int]:
    """How long each client's liveness key (``wire.keys.caller``) has left to live, in ms:
    only a beat of its client raises it."""
    return {name: int(store.pttl(name)) for name in store.scan_iter(match=keys.caller("*"))}


def _written_since(before: dict[bytes, int], after: dict[bytes, int]) -> bool:
    return any(name not in before or ttl > before[name] for name, ttl in after.items())


def per_call(counts: Counter[str], calls: int) -> dict[str, float]:
    return {name: n / calls for name, n in sorted(counts.items())}


async def one_at_a_time(call: Callable[[], Awaitable[object]], calls: int) -> None:
    for _ in range(calls):
        await call()


async def in_flight(call: Callable[[], Awaitable[object]], calls: int, limit: int) -> None:
    gate = asyncio.Semaphore(limit)

    async def one() -> None:
        async with gate:
            await call()

    await asyncio.gather(*(one() for _ in range(calls)))


@pytest.fixture(scope="module")
def tools(client: ToolClient) -> tuple[RemoteTool, RemoteTool]:
    plain = remote_tool("counted_noop", timeout=30, client=client)
    keyed = remote_tool("counted_noop_idempotent", timeout=30, client=client)
    assert keyed.idempotent and not plain.idempotent
    return plain, keyed


KEYS = itertools.count()


def test_a_plain_call_costs_nine_commands_one_call_at_a_time(
    store: redis.Redis, tools: tuple[RemoteTool, RemoteTool]
) -> None:
    plain, _ = tools

    async def call() -> None:
        await plain.invoke({})

    asyncio.run(one_at_a_time(call, 3))  # warm: scripts loaded, connections open
    counts = count_block(store, lambda: one_at_a_time(call, SEQUENTIAL), catalog_reads=False)

    assert per_call(counts, SEQUENTIAL) == PLAIN
    assert sum(PLAIN.values()) == 9


def test_the_first_call_of_an_idempotent_tool_costs_eleven_commands_one_call_at_a_time(
    store: redis.Redis, tools: tuple[RemoteTool, RemoteTool]
) -> None:
    _, keyed = tools

    async def call() -> None:
        key = next(KEYS)
        assert await keyed.invoke({"key": key}) == key

    asyncio.run(one_at_a_time(call, 3))
    counts = count_block(store, lambda: one_at_a_time(call, SEQUENTIAL), catalog_reads=False)

    # Two commands more than a plain call: the worker's begin and the stored outcome.
    # No GET, no DEL, no second script on the path.
    assert per_call(counts, SEQUENTIAL) == IDEMPOTENT
    assert sum(IDEMPOTENT.values()) == 11


def test_idempotent_calls_in_flight_share_the_claim_script_and_its_push(
    store: redis.Redis, tools: tuple[RemoteTool, RemoteTool]
) -> None:
    _, keyed = tools

    async def call() -> None:
        await keyed.invoke({"key": next(KEYS)})

    asyncio.run(one_at_a_time(call, 3))  # warm: scripts loaded, connections open
    counts = count_block(store, lambda: in_flight(call, CONCURRENT, IN_FLIGHT), catalog_reads=True)

    # Per call, whatever the batching: the claim's SET, the worker's BRPOP, begin,
    # store, reply push and its EXPIRE.
    assert {name: counts[name] for name in ("set", "brpop", "rpush", "expire")} == {
        "set": 3 * CONCURRENT,
        "brpop": CONCURRENT,
        "rpush": CONCURRENT,
        "expire": CONCURRENT,
    }
    # Per batch: one claim script and one LPUSH for every call it sent.
    assert counts["lpush"] == counts["evalsha"] < CONCURRENT
    # Per read of the reply list, and nothing else.
    assert set(counts) <= {
        "set",
        "brpop",
        "rpush",
        "expire",
        "lpush",
        "evalsha",
        "ltrim",
        "blmove",
        "lrange",
    }
