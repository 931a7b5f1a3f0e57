"""executor.seams.transport and the app's wiring: the copied kombu method is pinned.

kombu has no hook between ``BRPOP`` and its ``loads``, so toolexec's channel carries a
copy of kombu 5.7.0's ``Channel._brpop_read`` with the decode guarded. The first test
fails as soon as kombu's own method changes: compare the new source with
``executor/seams/transport.py``'s copy, carry the change over, then update the digest here.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import threading
import uuid
from pathlib import Path
from typing import Any

import kombu
import pytest
import redis
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu.transport import redis as kombu_redis

from executor.seams.app import create_app
from executor.seams.consumer import Consumer
from executor.seams.deadletter import Refusal
from executor.seams.transport import (
    BROKER_URL_OPTION,
    MAX_ITEM_OPTION,
    REDIS_URL_OPTION,
    Message,
    RefusedItem,
    Transport,
)
from toolexec import RedisServer
from wire.settings import Settings

from .poison import envelope

#: SHA-256 of ``inspect.getsource(kombu.transport.redis.Channel._brpop_read)``, kombu 5.7.0.
KOMBU_BRPOP_READ_SHA256 = "c42518699709f2df90f55a048fe6346612ae5527e5c4a6819f2c0920dc62088f"


def test_kombus_brpop_read_is_still_the_method_toolexecs_channel_copied() -> None:
    source = inspect.getsource(kombu_redis.Channel._brpop_read)

    assert "self.connection._deliver(loads(bytes_to_str(item)), dest)" in source
    assert hashlib.sha256(source.encode()).hexdigest() == KOMBU_BRPOP_READ_SHA256, (
        "kombu's Channel._brpop_read changed: carry the change into executor/seams/transport.py's "
        "copy, then update KOMBU_BRPOP_READ_SHA256"
    )


def test_the_worker_app_reads_its_queues_through_toolexecs_transport_and_consumer(
    redis_server: RedisServer,
) -> None:
    settings = Settings.from_env(
        {"TOOLEXEC_BROKER_URL": redis_server.url, "TOOLEXEC_MAX_ARGUMENT_BYTES": "1000"},
        tool_modules=(),
    )
    app = create_app(settings)

    assert app.conf.worker_consumer == "executor.seams.consumer:Consumer"
    options = app.conf.broker_transport_options
    assert options[REDIS_URL_OPTION] == settings.redis_url
    assert options[MAX_ITEM_OPTION] == 2 * 1000 + 65_536
    with app.connection_for_read() as connection:
        assert isinstance(connection.transport, Transport)
        channel = connection.default_channel
        assert channel.toolexec_redis_url == settings.redis_url
        assert channel.toolexec_max_item_bytes == 2 * 1000 + 65_536
        assert channel.Message is Message


def test_the_worker_waits_on_each_queues_own_list_only_as_calls_carry_no_priority(
    redis_server: RedisServer,
) -> None:
    settings = Settings.from_env({"TOOLEXEC_BROKER_URL": redis_server.url}, tool_modules=())
    app = create_app(settings)

    with app.connection_for_read() as connection:
        channel = connection.default_channel
        # One BRPOP key per queue, not kombu's four priority lists; a message with a
        # priority would still land on the list the worker waits on.
        assert channel.priority_steps == [0]
        assert {channel._q_for_pri("calls", p) for p in (0, 3, 9)} == {"calls"}


def test_a_broker_that_is_not_redis_keeps_the_transport_its_url_names(
    redis_server: RedisServer,
) -> None:
    settings = Settings.from_env(
        {"TOOLEXEC_BROKER_URL": "memory://", "TOOLEXEC_REDIS_URL": redis_server.url},
        tool_modules=(),
    )

    app = create_app(settings)

    assert app.conf.broker_transport is None
    assert app.conf.worker_consumer == "executor.seams.consumer:Consumer"
    assert issubclass(Consumer, CeleryConsumer)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda env: env.pop("properties"), "no properties object"),
        (lambda env: env["properties"].pop("delivery_tag"), "no delivery tag string"),
        (lambda env: env["properties"].update(delivery_tag=7), "no delivery tag string"),
        (lambda env: env["properties"].update(delivery_info=None), "no delivery_info"),
        (lambda env: env["properties"].update(body_encoding="gzip"), "an unknown body_encoding"),
        (lambda env: env.update(body=None), "no body string"),
        (lambda env: env.update(headers=[]), "headers that are not an object"),
        (lambda env: env.update({"content-type": 5}), "a content-type that is not a string"),
        (lambda env: env.update(body="abc"), "the body does not decode"),  # bad padding
    ],
)
def test_a_malformed_envelope_builds_no_message_and_says_why_without_quoting_it(
    change: Any, problem: str
) -> None:
    env = envelope("q")
    change(env)
    # Only the channel's codecs are read: kombu's Redis channel, not connected.
    channel = kombu_redis.Channel.__new__(kombu_redis.Channel)

    with pytest.raises(RefusedItem) as refused:
        Message(env, channel=channel)

    assert refused.value.reason is Refusal.NOT_AN_ENVELOPE
    assert refused.value.detail.startswith(problem)


def test_a_message_taken_but_not_acknowledged_goes_back_once_when_redis_returns_after_the_break(
    tmp_path: Path,
) -> None:
    # The worker's broker connection breaks (Redis restarts) while it holds a message it
    # has taken but not started: kombu puts it back when the channel closes, with Redis
    # still away. The put-back keeps trying, and the message is on its queue once.
    with RedisServer(directory=tmp_path / "broker", appendonly=True) as server:
        settings = Settings.from_env({"TOOLEXEC_BROKER_URL": server.url}, tool_modules=())
        app = create_app(settings)
        name = f"restore-{uuid.uuid4().hex[:8]}"
        queue = kombu.Queue(name, kombu.Exchange(name, type="direct"), routing_key=name)
        with app.connection_for_write() as connection:
            kombu.Producer(connection.default_channel).publish(
                {"call": 1},
                exchange=queue.exchange,
                routing_key=name,
                declare=[queue],
                headers={"id": "c1"},
                serializer="json",
            )
        with redis.Redis.from_url(server.url) as store:
            assert store.llen(name) == 1
        taken: list[Any] = []
        connection = app.connection_for_read()
        channel = connection.default_channel
        consumer = kombu.Consumer(
            channel, queues=[queue], callbacks=[lambda body, message: taken.append(message)]
        )
        consumer.consume()
        connection.drain_events(timeout=5)
        assert len(taken) == 1 and taken[0].delivery_tag in channel.qos._delivered
        assert app.conf.broker_transport_options[BROKER_URL_OPTION] == server.url

        server.stop()
        back = threading.Timer(1.0, server.start)  # the outage's length: a duration
        back.start()
        try:
            # What Celery's consumer does with its broken connection as it restarts: kombu
            # puts back what was taken and not acknowledged, the connection already gone.
            connection.collect()
        finally:
            back.join()

        with redis.Redis.from_url(server.url) as store:
            items = store.lrange(name, 0, -1)
        assert len(items) == 1
        restored = json.loads(items[0])
        assert restored["headers"] == {"id": "c1"} and restored["redelivered"] is True
