"""executor.seams.transport's batched read: one ``BLMPOP`` per wake-up, within prefetch.

Each test runs kombu's consumer on toolexec's transport against a private Redis, as the
worker's main process does (``connection.drain_events``: the channel's ``_brpop_start``
and ``_brpop_read``), and counts the server's commands (``INFO commandstats``).
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import types
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kombu
import pytest
import redis
from celery import Celery
from kombu.transport import redis as kombu_redis

from executor.seams.app import create_app
from executor.seams.transport import BATCH_MAX, Channel
from tests.redis_stats import calls_of
from toolexec import RedisServer
from wire import keys
from wire.copies import sent_again
from wire.settings import Settings

#: SHA-256 of ``inspect.getsource(kombu.transport.redis.Channel._brpop_start)``, kombu 5.7.0.
KOMBU_BRPOP_START_SHA256 = "06723d707ddf224025af70ff511e07a27e1e8a37ec509e7dfa11ee408a79ccec"


@pytest.fixture
def any_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of the test's own, so that its command counts are the test's."""
    with RedisServer(directory=tmp_path / "broker") as started:
        yield started


@pytest.fixture
def server(any_server: RedisServer) -> RedisServer:
    """:func:`any_server`, which must speak ``BLMPOP`` (Redis 7.0): the read under test."""
    if _major(any_server) < 7:
        pytest.fail(
            "the batched-read tests need a redis-server 7.0 or newer on PATH (e.g. Debian's); "
            f"found {any_server.description}, whose Redis lacks BLMPOP (a worker on it reads with "
            "BRPOP, which test_a_broker_that_refuses_blmpop_is_read_with_brpop_after_one_warning "
            "shows)",
            pytrace=False,
        )
    return any_server


def _major(server: RedisServer) -> int:
    return int((server.version or "0").split(".")[0])


def app_on(url: str, *, ack_emulation: bool = False) -> Celery:
    settings = Settings.from_env(
        {
            "TOOLEXEC_BROKER_URL": url,
            "TOOLEXEC_ACK_EMULATION": "true" if ack_emulation else "false",
        },
        tool_modules=(),
    )
    return create_app(settings)


def publish(app: Celery, queue: kombu.Queue, count: int) -> None:
    with app.connection_for_write() as connection:
        producer = kombu.Producer(connection.default_channel)
        for number in range(count):
            producer.publish(
                {"n": number},
                exchange=queue.exchange,
                routing_key=queue.routing_key,
                declare=[queue],
                serializer="json",
            )


def a_queue() -> kombu.Queue:
    name = f"batch-{uuid.uuid4().hex[:8]}"
    return kombu.Queue(name, kombu.Exchange(name, type="direct"), routing_key=name)


@pytest.fixture
def store(any_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of the test's Redis, closed after the test."""
    with redis.Redis.from_url(any_server.url) as client:
        yield client


def commands(url: str, name: str) -> int:
    with redis.Redis.from_url(url) as client:
        return calls_of(client, name)


def test_kombus_brpop_start_is_still_the_method_toolexecs_channel_copied() -> None:
    source = inspect.getsource(kombu_redis.Channel._brpop_start)

    assert hashlib.sha256(source.encode()).hexdigest() == KOMBU_BRPOP_START_SHA256, (
        "kombu's Channel._brpop_start changed: carry the change into "
        "executor/seams/transport.py's batched _brpop_start, then update "
        "KOMBU_BRPOP_START_SHA256"
    )


def test_one_read_takes_as_many_messages_as_prefetch_leaves_room_for_in_queue_order(
    server: RedisServer, store: redis.Redis
) -> None:
    app, queue = app_on(server.url), a_queue()
    publish(app, queue, 10)
    taken: list[Any] = []
    with app.connection_for_read() as connection:
        channel = connection.default_channel
        assert isinstance(channel, Channel)
        consumer = kombu.Consumer(
            channel, queues=[queue], callbacks=[lambda body, message: taken.append(message)]
        )
        consumer.qos(prefetch_count=4)
        consumer.consume()

        connection.drain_events(timeout=5)

        # One BLMPOP brought four messages, the oldest first, and left six queued.
        assert [m.payload["n"] for m in taken] == [0, 1, 2, 3]
        assert (commands(server.url, "blmpop"), commands(server.url, "brpop")) == (1, 0)
        assert store.llen(queue.name) == 6
        assert len(channel.qos._delivered) == 4

        taken[0].ack()
        taken[1].ack()
        connection.drain_events(timeout=5)

        # Two acknowledged: room for two more, and no more than that.
        assert [m.payload["n"] for m in taken] == [0, 1, 2, 3, 4, 5]
        assert store.llen(queue.name) == 4
        assert channel.qos.can_consume() is False


def test_a_read_takes_at_most_batch_max_messages(server: RedisServer, store: redis.Redis) -> None:
    app, queue = app_on(server.url), a_queue()
    publish(app, queue, BATCH_MAX + 5)
    taken: list[Any] = []
    with app.connection_for_read() as connection:
        consumer = kombu.Consumer(
            connection.default_channel,
            queues=[queue],
            callbacks=[lambda body, message: taken.append(message)],
        )
        consumer.qos(prefetch_count=1000)
        consumer.consume()

        connection.drain_events(timeout=5)

        assert len(taken) == BATCH_MAX
        assert store.llen(queue.name) == 5


def test_with_ack_emulation_each_read_takes_one_message_with_brpop(
    any_server: RedisServer, store: redis.Redis
) -> None:
    server = any_server  # a BRPOP read: any Redis
    app, queue = app_on(server.url, ack_emulation=True), a_queue()
    publish(app, queue, 3)
    taken: list[Any] = []
    with app.connection_for_read() as connection:
        consumer = kombu.Consumer(
            connection.default_channel,
            queues=[queue],
            callbacks=[lambda body, message: taken.append(message)],
        )
        consumer.qos(prefetch_count=3)
        consumer.consume()

        connection.drain_events(timeout=5)

        # No more than one popped message is ever outside kombu's unacknowledged hash.
        assert len(taken) == 1
        assert (commands(server.url, "blmpop"), commands(server.url, "brpop")) == (0, 1)
        assert store.hlen("unacked") == 1
        assert store.llen(queue.name) == 2


def test_the_messages_after_one_whose_delivery_broke_go_back_on_their_queue_once(
    server: RedisServer, store: redis.Redis
) -> None:
    app, queue = app_on(server.url), a_queue()
    publish(app, queue, 5)
    queued = list(reversed(store.lrange(queue.name, 0, -1)))  # in the order BLMPOP pops
    taken: list[Any] = []

    def take(body: Any, message: Any) -> None:
        if len(taken) == 1:
            raise redis.ConnectionError("the broker connection broke")
        taken.append(message)

    with app.connection_for_read() as connection:
        channel = connection.default_channel
        consumer = kombu.Consumer(channel, queues=[queue], callbacks=[take])
        consumer.qos(prefetch_count=5)
        consumer.consume()

        with pytest.raises(redis.ConnectionError):
            connection.drain_events(timeout=5)

        # The first was delivered; the second is kombu's to put back (it was delivered,
        # unacknowledged); the three the read took after it are back at the front of the
        # queue, in the order they were taken (the next read takes the first of them), as
        # copies sent again (wire.copies): flagged, generation 0, the original text after.
        assert [m.payload["n"] for m in taken] == [0]
        again = [sent_again(item, 0).encode() for item in queued[2:]]
        assert list(reversed(store.lrange(queue.name, 0, -1))) == again

        # Put back a second time (an answer lost): nothing is queued twice.
        channel.put_backs.put_back_unread(queued[2:], queue.name)
        assert list(reversed(store.lrange(queue.name, 0, -1))) == again
        assert store.exists(keys.restored(hashlib.sha256(queued[2]).hexdigest(), queue.name))


def test_a_broker_that_refuses_blmpop_is_read_with_brpop_after_one_warning(
    any_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    server = any_server
    if _major(server) >= 7:
        # A deployment whose ACL predates the batched read: every command but BLMPOP.
        with redis.Redis.from_url(server.url) as client:
            client.acl_setuser(
                "nolmpop",
                enabled=True,
                passwords=["+secret-of-the-test"],
                keys=["*"],
                channels=["*"],
                commands=["+@all", "-blmpop"],
            )
        url = server.url_for("nolmpop", "secret-of-the-test")
    else:
        url = server.url  # Redis 6.2 knows no BLMPOP at all
    app, queue = app_on(url), a_queue()
    publish(app, queue, 3)
    taken: list[Any] = []
    with (
        caplog.at_level(logging.WARNING, logger="executor.seams.transport"),
        app.connection_for_read() as connection,
    ):
        consumer = kombu.Consumer(
            connection.default_channel,
            queues=[queue],
            callbacks=[lambda body, message: taken.append(message)],
        )
        consumer.qos(prefetch_count=3)
        consumer.consume()

        while len(taken) < 3:
            connection.drain_events(timeout=5)

    assert [m.payload["n"] for m in taken] == [0, 1, 2]
    refusals = [r for r in caplog.records if "refused BLMPOP" in r.getMessage()]
    assert len(refusals) == 1
    assert commands(server.url, "brpop") == 3


def test_with_celerys_disable_prefetch_each_read_takes_one_message(
    any_server: RedisServer, store: redis.Redis
) -> None:
    server = any_server  # a BRPOP read: any Redis
    app, queue = app_on(server.url), a_queue()
    publish(app, queue, 3)
    taken: list[Any] = []
    with app.connection_for_read() as connection:
        channel = connection.default_channel
        consumer = kombu.Consumer(
            channel, queues=[queue], callbacks=[lambda body, message: taken.append(message)]
        )
        consumer.qos(prefetch_count=3)
        # What Celery's worker_disable_prefetch does before the worker consumes: the
        # channel's QoS asks the pool for a free slot.
        qos = channel.qos
        allowed = qos.can_consume
        qos.can_consume = types.MethodType(lambda self: allowed(), qos)
        consumer.consume()

        connection.drain_events(timeout=5)

        assert len(taken) == 1
        assert (commands(server.url, "blmpop"), commands(server.url, "brpop")) == (0, 1)
