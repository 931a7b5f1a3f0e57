"""The asyncio pool's reader of its queues (executor.pools.reads), against a real Redis.

The reader is given a channel of its own protocol (``ReadChannel``) that records what it
is handed: what Celery's channel does with a read is the transport's tests' and the
worker's (tests/integration/test_loop_reads.py). Here: how much a read takes, that a
detached reader hands nothing over and loses nothing, that it reads with ``BRPOP`` where
``BLMPOP`` is refused, and that it reads again after Redis restarts.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

from executor.pools.reads import LoopReader
from tests.integration.polling import wait_until
from toolexec.redis_server import RedisServer


class _Channel:
    """Records each read handed over; a put-back pushes the items back where they were."""

    def __init__(self, client: redis.Redis, queues: Sequence[str], room: int) -> None:
        self._client = client
        self.queues = list(queues)
        self.room = room  # what the pool would have: one slot fewer per call handed over
        self.delivered: list[bytes] = []
        self.reads: list[tuple[str, list[bytes]]] = []
        self.put_back: list[bytes] = []

    def toolexec_read_lists(self) -> list[str]:
        return list(self.queues)

    def toolexec_deliver_read(self, popped_from: str, items: Sequence[bytes]) -> None:
        self.reads.append((popped_from, list(items)))
        self.delivered.extend(items)
        self.room -= len(items)

    def toolexec_put_back_unread(self, items: Sequence[bytes], popped_from: str) -> None:
        self.put_back.extend(items)
        self._client.rpush(popped_from, *reversed(items))


class _Loop:
    """An event loop in a thread of its own, as the pool's."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coroutine: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


@pytest.fixture
def loop() -> Iterator[_Loop]:
    running = _Loop()
    yield running
    running.close()


def _reader(url: str, channel: _Channel, loop: _Loop, *, block: float = 1.0) -> LoopReader:
    reader = LoopReader(url, master=None, room=lambda: channel.room, block=block)
    reader.start(loop.loop)
    return reader


def _blocked(client: redis.Redis) -> int:
    return int(client.info("clients")["blocked_clients"])


def _queue() -> str:
    return f"reads-{uuid.uuid4().hex}"


def _user(client: redis.Redis, server: RedisServer, *rules: str) -> str:
    """A URL of the server for a new user allowed everything but ``rules`` take away."""
    name, password = f"u{uuid.uuid4().hex[:12]}", uuid.uuid4().hex
    client.execute_command(
        "ACL", "SETUSER", name, "on", f">{password}", "~*", "&*", "+@all", *rules
    )
    return server.url_for(name, password)


def test_a_read_takes_no_more_calls_than_the_pool_has_room_for(
    redis_server: RedisServer, client: redis.Redis, loop: _Loop
) -> None:
    queue = _queue()
    channel = _Channel(client, [queue], room=2)
    reader = _reader(redis_server.url, channel, loop)
    client.lpush(queue, b"1", b"2", b"3", b"4", b"5")
    try:
        reader.attach(channel)
        assert wait_until(lambda: len(channel.delivered) == 2, timeout=10)
        # No room: no read is sent, and the other three wait on the queue for anyone.
        assert channel.delivered == [b"1", b"2"]
        assert client.llen(queue) == 3
        assert _blocked(client) == 0

        channel.room = 10
        reader.wake()  # a call ended
        assert wait_until(lambda: len(channel.delivered) == 5, timeout=10)
        assert channel.delivered == [b"1", b"2", b"3", b"4", b"5"]  # the queue's order
        assert [items for _, items in channel.reads] == [[b"1", b"2"], [b"3", b"4", b"5"]]
        assert reader.messages == 5 and reader.reads == 2
    finally:
        loop.run(reader.stop())


def test_detach_ends_the_read_under_way_and_nothing_is_read_after_it(
    redis_server: RedisServer, client: redis.Redis, loop: _Loop
) -> None:
    queue = _queue()
    channel = _Channel(client, [queue], room=10)
    # A read blocks for 30 s, far past detach's patience: only its wake-up ends it.
    reader = _reader(redis_server.url, channel, loop, block=30.0)
    try:
        reader.attach(channel)
        assert wait_until(lambda: _blocked(client) == 1, timeout=10)  # blocked on the queue

        reader.detach()

        # The read ended, popping only its wake token; and no read starts again.
        assert _blocked(client) == 0
        client.lpush(queue, b"after")
        assert client.llen(queue) == 1
        assert channel.delivered == [] and channel.put_back == []
    finally:
        loop.run(reader.stop())
    assert client.lrange(queue, 0, -1) == [b"after"]
    assert not list(client.scan_iter(match="toolexec:reads:wake:*"))  # stop() removed it


def test_a_read_that_returns_after_detach_goes_back_on_its_queue_not_to_the_channel(
    redis_server: RedisServer, client: redis.Redis, loop: _Loop
) -> None:
    # The wake token cannot be pushed (an ACL without LPUSH): the read under way runs
    # on, and what it pops then must go back, never to the detached channel.
    url = _user(client, redis_server, "-lpush")
    client.execute_command("ACL", "LOG", "RESET")
    queue = _queue()
    channel = _Channel(client, [queue], room=10)
    reader = _reader(url, channel, loop, block=30.0)
    try:
        reader.attach(channel)
        assert wait_until(lambda: _blocked(client) == 1, timeout=10)
        detaching = threading.Thread(target=reader.detach)
        detaching.start()
        # The wake-up was tried and refused: the reader is detached, its read still blocked.
        assert wait_until(lambda: _refused(client, "lpush"), timeout=10)
        assert _blocked(client) == 1

        client.lpush(queue, b"a", b"b")  # the blocked read pops both
        detaching.join(15)

        assert not detaching.is_alive()
        assert channel.delivered == []
        assert wait_until(lambda: client.llen(queue) == 2, timeout=10)
    finally:
        loop.run(reader.stop())
    assert channel.put_back == [b"a", b"b"]
    assert client.lrange(queue, 0, -1) == [b"b", b"a"]  # as they were: the next read takes a


def test_a_broker_that_refuses_blmpop_is_read_one_message_per_brpop(
    redis_server: RedisServer,
    client: redis.Redis,
    loop: _Loop,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="executor.pools.reads")
    url = _user(client, redis_server, "-blmpop")
    queue = _queue()
    channel = _Channel(client, [queue], room=10)
    client.lpush(queue, b"1", b"2", b"3")
    reader = _reader(url, channel, loop)
    try:
        reader.attach(channel)
        assert wait_until(lambda: len(channel.delivered) == 3, timeout=10)
    finally:
        loop.run(reader.stop())
    assert channel.delivered == [b"1", b"2", b"3"]
    assert [len(items) for _, items in channel.reads] == [1, 1, 1]
    assert any("refused BLMPOP" in r.getMessage() for r in caplog.records)


def test_the_reader_reads_again_after_redis_restarts(tmp_path: Path, loop: _Loop) -> None:
    with RedisServer(directory=tmp_path) as server, redis.Redis.from_url(server.url) as client:
        queue = _queue()
        channel = _Channel(client, [queue], room=10)
        reader = _reader(server.url, channel, loop)
        try:
            reader.attach(channel)
            client.lpush(queue, b"before")
            assert wait_until(lambda: channel.delivered == [b"before"], timeout=10)

            server.restart()
            client.lpush(queue, b"after")

            assert wait_until(lambda: channel.delivered == [b"before", b"after"], timeout=15)
        finally:
            loop.run(reader.stop())


def _refused(client: redis.Redis, command: str) -> bool:
    return any(
        entry.get("object") == command or entry.get(b"object") == command.encode()
        for entry in client.acl_log()
    )
