"""Over RabbitMQ, the client publishes the message ``app.send_task`` publishes.

The client's AMQP publisher (:mod:`agent_client._io.amqp_lane`) and stock ``send_task``, on an
app that declares its queues as the worker's app does, each publish the same call to a
queue of their own on the machine's RabbitMQ (127.0.0.1:5672; names unique to the
test, deleted after it). Both messages are fetched raw (``basic.get``) and compared
field for field: properties, headers, body, exchange and routing key, ids and times
aside. The queue the client declares is compared with the worker's declaration too.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from kombu.connection import Connection
from kombu.entity import Queue

from agent_client._io.amqp_lane import AmqpChannel, Published, queue_entity
from executor.seams.app import create_app
from wire.message import CELERY_EXPIRY_GRACE, CELERY_LIMIT_MARGIN
from wire.models import task_name_for
from wire.settings import Settings

from .support import Check, differences, send_like_the_client
from .test_envelope import (
    CASES,
    Case,
    nonempty_strings,
    prepare,
    remaining_ms,
    routed_to,
    same_instant,
)

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"


@pytest.fixture
def queues() -> Iterator[tuple[str, str]]:
    """Two queue names of this test's own (the client's, send_task's); deleted after it."""
    token = uuid.uuid4().hex[:12]
    names = (f"amqp_contract_client_{token}", f"amqp_contract_stock_{token}")
    yield names
    with Connection(AMQP_URL, connect_timeout=5) as connection:  # type: ignore[no-untyped-call]
        channel = connection.channel()
        for name in names:
            channel.queue_delete(name)


def stock_producer(queue: str) -> Celery:
    """A stock Celery app on RabbitMQ whose queues are declared as the worker's app
    declares them."""
    app = Celery("contract-amqp-producer", broker=AMQP_URL, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_default_queue="default",
        task_queues=[Queue(queue, routing_key=queue)],  # type: ignore[no-untyped-call]
    )
    return app


def fetched(queue: str) -> dict[str, Any]:
    """The one message in ``queue``, taken raw, as a dict of what travelled."""
    with Connection(AMQP_URL, connect_timeout=5) as connection:  # type: ignore[no-untyped-call]
        message = connection.channel().basic_get(queue, no_ack=True)
        assert message is not None, f"no message in {queue}"
        assert connection.channel().queue_declare(queue, passive=True).message_count == 0
    properties = dict(message.properties)
    headers = properties.pop("application_headers")
    return {
        "properties": properties,
        "headers": headers,
        "body": json.loads(message.body),
        "exchange": message.delivery_info["exchange"],
        "routing_key": message.delivery_info["routing_key"],
    }


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_client_publishes_the_message_send_task_publishes_ids_and_times_aside(
    case: Case, queues: tuple[str, str], contract_settings: Settings
) -> None:
    queue_a, queue_b = queues
    client_from = time.time()
    call = prepare(case, queue=queue_a, settings=contract_settings)
    channel = AmqpChannel(AMQP_URL)
    try:
        channel.connect(5.0)
        assert channel.publish([call.envelope], 5.0) == [Published("confirmed")]
    finally:
        channel.close(politely=True)
    client_until = time.time()
    hard = case.spec.hard_timeout + CELERY_LIMIT_MARGIN if case.spec.hard_timeout else None
    task_name = task_name_for(case.spec.delivery)
    producer = stock_producer(queue_b)
    stock_from = time.time()
    try:
        send_like_the_client(
            producer, call.request, task_name=task_name, queue=queue_b, hard_limit=hard
        )
    finally:
        producer.close()
    stock_until = time.time()

    client, stock = fetched(queue_a), fetched(queue_b)
    allowed: dict[str, Check] = {
        "headers.origin": nonempty_strings,
        "headers.expires": same_instant,
        "properties.reply_to": nonempty_strings,
        "routing_key": routed_to(queue_a, queue_b),
    }
    if call.request.deadline is not None:
        expires = call.request.deadline + CELERY_EXPIRY_GRACE
        allowed["properties.expiration"] = remaining_ms(
            expires, min(client_from, stock_from), max(client_until, stock_until)
        )
    problems = differences(client, stock, allowed)
    assert not problems, "the client's message differs from send_task's:\n" + "\n".join(problems)

    # What both must say, so the comparison above is not two equal mistakes.
    assert client["exchange"] == "" and client["routing_key"] == queue_a
    assert client["properties"]["content_type"] == "application/json"
    assert client["properties"]["delivery_mode"] == 2
    assert client["properties"]["correlation_id"] == call.call_id
    assert client["properties"]["reply_to"] == call.request.reply_to
    assert (client["headers"]["task"], client["headers"]["id"]) == (task_name, call.call_id)
    args, kwargs, _embed = client["body"]
    assert args == [] and kwargs == call.request.model_dump(mode="json")
    if case.timeout is None:
        assert client["headers"]["expires"] is None and "expiration" not in client["properties"]
    else:
        assert "expiration" in client["properties"]


def test_the_client_declares_each_queue_as_the_workers_app_declares_it(
    contract_settings: Settings,
) -> None:
    settings = contract_settings.model_copy(
        update={"broker_url": AMQP_URL, "redis_url": contract_settings.redis_url}
    )
    worker_app = create_app(settings)
    try:
        queue = next(iter(worker_app.amqp.queues))  # "default" and every tool's queue
        declared: dict[str, Any] = worker_app.amqp.queues[queue].as_dict(recurse=True)
    finally:
        worker_app.close()
    assert declared["exchange"]["name"] == "default"
    assert queue_entity(queue).as_dict(recurse=True) == declared  # type: ignore[no-untyped-call]
