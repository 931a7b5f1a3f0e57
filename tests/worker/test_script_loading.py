"""wire.scripts: scripts run by SHA, and loaded again the one way when the server forgot them.

On the worker's client (``LuaScript.run``) and in a pipeline of the agent's I/O link
(``agent_client._io.link.Link``, which sends :func:`wire.scripts.reloading`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from agent_client._io.link import Arg, Link
from toolexec import RedisServer
from wire import keys
from wire.copies import PUSH_ONCE
from wire.scripts import RELEASE, reloading

from .keyed import HOLDER, TTL_MS
from .support import unique


def test_a_script_the_server_forgot_is_loaded_again_and_run(client: redis.Redis) -> None:
    key = unique("held")
    RELEASE.load(client)
    client.script_flush()
    assert client.script_exists(RELEASE.sha) == [False]
    client.set(key, HOLDER)

    assert RELEASE.run(client, [key], [HOLDER]) == 1

    assert not client.exists(key)
    assert client.script_exists(RELEASE.sha) == [True]


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A server of its own, whose scripts and command counts a test may reset."""
    with RedisServer(directory=tmp_path_factory.mktemp("own-redis")) as server:
        yield server


def run_on_link(url: str, commands: list[tuple[Arg, ...]]) -> list[Any]:
    """``commands`` as one pipeline on the agent's I/O link (agent_client._io.link.Link)."""

    async def execute() -> list[Any]:
        link = Link(url)
        try:
            return await link.execute(commands, timeout=5.0)
        finally:
            await link.close()

    return asyncio.run(execute())


def test_the_agents_link_loads_each_forgotten_script_once_and_runs_the_entries_that_failed_again(
    own_server: RedisServer,
) -> None:
    with redis.Redis.from_url(own_server.url) as server:
        server.mset({"k1": HOLDER, "k2": HOLDER})
        server.script_flush()
        server.config_resetstat()

        replies = run_on_link(
            own_server.url,
            [
                RELEASE.command(["k1"], [HOLDER]),
                ("EXISTS", "k1"),
                RELEASE.command(["k2"], [HOLDER]),
                PUSH_ONCE.command(["queue", keys.sent("call-1")], [TTL_MS, "message"]),
                ("LLEN", "queue"),
            ],
        )
        counts = server.info("commandstats")

        # Every entry ran; those of forgotten scripts after the rest, in a second round trip.
        assert replies == [1, 1, 1, [1], 0]
        assert not server.exists("k1", "k2")
        assert server.lrange("queue", 0, -1) == [b"message"]
        assert server.script_exists(RELEASE.sha, PUSH_ONCE.sha) == [True, True]
        # Redis 6.2 counts every SCRIPT subcommand as one (cmdstat_script), 7.0 apart;
        # only SCRIPT LOAD ran since the reset.
        loads = counts.get("cmdstat_script|load") or counts["cmdstat_script"]
        assert loads["calls"] == 2  # once per script, not per entry
        assert (counts["cmdstat_evalsha"]["calls"], counts["cmdstat_evalsha"]["failed_calls"]) == (
            6,
            3,
        )


def test_the_agents_link_runs_known_scripts_by_sha_alone(own_server: RedisServer) -> None:
    with redis.Redis.from_url(own_server.url) as server:
        server.set("k1", HOLDER)
        RELEASE.load(server)
        server.config_resetstat()

        replies = run_on_link(own_server.url, [RELEASE.command(["k1"], [HOLDER])])
        counts = server.info("commandstats")

        assert replies == [1]
        # No SCRIPT EXISTS or SCRIPT LOAD up front: one EVALSHA, answered.
        assert {name for name in counts if name.startswith("cmdstat_script")} == set()
        assert (counts["cmdstat_evalsha"]["calls"], counts["cmdstat_evalsha"]["failed_calls"]) == (
            1,
            0,
        )


def test_reloading_loads_each_script_once_then_sends_the_forgotten_entries_in_order() -> None:
    commands: list[tuple[Arg, ...]] = [
        RELEASE.command(["a"], ["x"]),
        ("GET", "b"),
        PUSH_ONCE.command(["q", "s"], [1, "m"]),
        RELEASE.command(["c"], ["y"]),
    ]

    assert reloading(commands, [0, 2, 3]) == [
        ("SCRIPT", "LOAD", RELEASE.source),
        ("SCRIPT", "LOAD", PUSH_ONCE.source),
        commands[0],
        commands[2],
        commands[3],
    ]
