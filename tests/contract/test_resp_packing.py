"""toolexec packs its commands (``wire.resp``) into the bytes redis-py would.

The client's link sends every pipeline through :func:`wire.resp.pack`, and every
blocking client of the product packs with :data:`wire.resp.PACKER`: both hand each
command to hiredis as it is, instead of redis-py's packing, which passes over every
argument in Python first (``python -m bench.resp``: several times slower). The bytes must
be redis-py's, for every argument type a command holds, on the hiredis and redis-py
versions installed; and an argument of a type neither takes must be refused the same
way, as redis-py's ``DataError``. A last check sends packed commands to a real Redis and
reads its answers, and a blocking client of the product runs a pipeline.
"""

from __future__ import annotations

import math
import socket
from pathlib import Path

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.connection import Connection

from bench.resp import COMMANDS
from toolexec import RedisServer
from wire.connect import sync_client
from wire.resp import PACKER, Arg, Packer, pack

#: Every argument type toolexec's commands hold: text (any character but a lone
#: surrogate, which no encoder takes), bytes, ints of any size, and floats.
ARGS = st.one_of(
    st.text(alphabet=st.characters(exclude_categories=["Cs"])),
    st.binary(),
    st.integers(),
    st.floats(),
)
COMMAND = st.tuples(st.sampled_from(["SET", "XADD", "EVALSHA", "LPUSH"]), st.lists(ARGS)).map(
    lambda named: (named[0], *named[1])
)


def redis_pys(commands: list[tuple[Arg, ...]]) -> bytes:
    return b"".join(Connection().pack_commands(commands))


def redis_pys_blocking(*args: object) -> bytes:
    return b"".join(redis.connection.Connection().pack_command(*args))


def packers(*args: object) -> bytes:
    return b"".join(Packer().pack(*args))


@given(st.lists(COMMAND, min_size=1, max_size=5))
def test_any_commands_pack_into_redis_pys_bytes(commands: list[tuple[Arg, ...]]) -> None:
    assert pack(commands) == redis_pys(commands)


@given(COMMAND)
def test_the_blocking_clients_packer_gives_redis_pys_bytes(command: tuple[Arg, ...]) -> None:
    assert packers(*command) == redis_pys_blocking(*command)


@pytest.mark.parametrize(
    "command",
    [
        ("CONFIG GET", "maxmemory"),  # redis-py splits a first word that holds a space
        (b"CLIENT SETNAME", "worker"),
        ("SET", "k", bytearray(b"x")),  # hiredis takes no bytearray: redis-py's way
        ("SET", "k", memoryview(b"abc")),
        ("SET", "k", 1.5, "PX", 10**3),
    ],
)
def test_what_hiredis_will_not_take_as_it_is_goes_redis_pys_way(
    command: tuple[object, ...],
) -> None:
    assert packers(*command) == redis_pys_blocking(*command)


@pytest.mark.parametrize("value", [True, None, [1]])
def test_the_blocking_clients_packer_refuses_what_redis_py_refuses(value: object) -> None:
    with pytest.raises(redis.DataError):
        Packer().pack("SET", "k", value)
    with pytest.raises(redis.DataError):
        redis_pys_blocking("SET", "k", value)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_the_clients_own_commands_pack_into_redis_pys_bytes(name: str) -> None:
    commands = [COMMANDS[name]] * 3
    assert pack(commands) == redis_pys(commands)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 10**40, -0.0, b"\x00" * 70_000])
def test_edge_values_pack_into_redis_pys_bytes(value: Arg) -> None:
    assert pack([("SET", "k", value)]) == redis_pys([("SET", "k", value)])


@pytest.mark.parametrize("value", [True, None, [1], bytearray(b"x")])
def test_an_argument_neither_takes_is_refused_as_redis_py_refuses_it(value: object) -> None:
    with pytest.raises(redis.DataError):
        pack([("SET", "k", value)])  # type: ignore[list-item]
    if not isinstance(value, bytearray):  # redis-py copies a bytearray; toolexec never sends one
        with pytest.raises(redis.DataError):
            redis_pys([("SET", "k", value)])  # type: ignore[list-item]


def test_a_blocking_client_of_the_product_packs_with_hiredis_and_is_answered(
    tmp_path: Path,
) -> None:
    with RedisServer(directory=tmp_path / "redis") as server, sync_client(server.url) as client:
        assert client.connection_pool.connection_kwargs["command_packer"] is PACKER
        pipe = client.pipeline(transaction=False)
        pipe.set("k", "é" * 3).get("k").xadd("s", {"e": "sent", "t": 1}).config_get("maxmemory")
        answers = pipe.execute()
    assert answers[:2] == [True, "ééé".encode()]
    assert answers[2] and "maxmemory" in {
        k.decode() if isinstance(k, bytes) else k for k in answers[3]
    }


def test_redis_answers_commands_so_packed(tmp_path: Path) -> None:
    with (
        RedisServer(directory=tmp_path / "redis") as server,
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock,
    ):
        sock.sendall(
            pack([("SET", "k", "é" * 3), ("GET", "k"), ("INCRBY", "n", 10**6), ("TYPE", "k")])
        )
        replies = b""
        while replies.count(b"\r\n") < 5:
            replies += sock.recv(4096)
    assert replies == b"+OK\r\n$6\r\n" + "ééé".encode() + b"\r\n:1000000\r\n+string\r\n"
