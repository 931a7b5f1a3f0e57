"""executor.seams.request: an at-least-once call whose process keeps dying is given up.

The request is built as Celery's consumer builds it, from a kombu message in the
client's own format, taken by a pool child whose pid has exited; ``on_failure`` then
gets the ``WorkerLostError`` billiard reports. Each loss is counted in Redis; Celery
requeues the call until ``TOOLEXEC_MAX_DELIVERIES`` losses, after which the message is
acknowledged, dead-lettered, and every waiter is told ``WorkerLost`` naming the attempts.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis
from billiard.einfo import ExceptionInfo
from billiard.exceptions import WorkerLostError
from celery import Celery
from celery.worker.request import Request
from kombu.message import Message

from executor.errors import ProcessRetired
from executor.seams.celery_tasks import register_tasks
from executor.worker import holder
from wire import keys
from wire.formats import running_state, waiter_entry
from wire.message import encode_arguments, message_body, task_headers
from wire.models import TASK_AT_LEAST_ONCE, TASK_AT_MOST_ONCE, CallRequest, ErrorKind
from wire.settings import Settings

from .conftest import WORKER_HOSTNAME
from .support import make_call, next_reply, no_reply, unique


class Acks:
    """What the request did with its message (Celery's on_ack / on_reject callbacks)."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def ack(self, *_: Any) -> None:
        self.events.append("ack")

    def reject(self, _logger: Any, _errors: Any, requeue: bool = False) -> None:
        self.events.append("requeue" if requeue else "reject")


def app_with(celery_app: Celery, settings: Settings, **overrides: Any) -> Celery:
    """Celery's test app with toolexec's tasks, their settings changed by ``overrides``."""
    register_tasks(celery_app, settings.model_copy(update=overrides))
    return celery_app


def delivery(app: Celery, call: CallRequest, task: str, pid: int) -> tuple[Request, Acks]:
    """One delivery of ``call``: its request, accepted by the pool child ``pid``."""
    acks = Acks()
    message = Message(  # type: ignore[no-untyped-call]  # kombu is untyped
        body=message_body(call, encode_arguments(call.arguments)),
        headers=task_headers(call, task_name=task),
        content_type="application/json",
        content_encoding="utf-8",
        delivery_info={"exchange": "", "routing_key": "default"},
    )
    request = app.tasks[task].Request(
        message, app=app, hostname=WORKER_HOSTNAME, on_ack=acks.ack, on_reject=acks.reject
    )
    request.on_accepted(pid, time.monotonic())
    return request, acks


def worker_lost() -> ExceptionInfo:
    """What billiard reports for a child that died."""
    try:
        raise WorkerLostError("Worker exited prematurely: exitcode 1 Job: 0.")
    except WorkerLostError:
        return ExceptionInfo()


def retired() -> ExceptionInfo:
    """What billiard reports for a child that raised ProcessRetired after replying."""
    try:
        raise ProcessRetired("leaving")
    except ProcessRetired:
        return ExceptionInfo()


def test_a_lost_at_least_once_call_is_requeued_until_the_limit_then_acknowledged_and_every_waiter_told(  # noqa: E501
    celery_app: Celery, settings: Settings, client: redis.Redis, exited_pid: int
) -> None:
    app = app_with(celery_app, settings, max_deliveries=3)
    key = unique("key")
    call = make_call("book", idempotency_key=key, deadline=time.time() + 60)
    joiner = make_call("book", idempotency_key=key)
    client.set(keys.claim(key), call.call_id, ex=60)
    client.rpush(keys.waiters(key), waiter_entry(joiner.reply_to, joiner.call_id))
    entries_before = client.hget(keys.DEADLETTER_COUNT, "worker_lost")

    events = []
    for _ in range(3):
        client.set(keys.state(key), running_state(holder(WORKER_HOSTNAME, exited_pid)), ex=60)
        request, acks = delivery(app, call, TASK_AT_LEAST_ONCE, exited_pid)
        request.on_failure(worker_lost())
        events.append(acks.events)
        if len(events) < 3:
            assert no_reply(client, call.reply_to)

    assert events == [["requeue"], ["requeue"], ["ack"]]
    expected = "the worker process died 3 times running this call; it was given up"
    for waiter in (call, joiner):
        call_id, outcome = next_reply(client, waiter.reply_to)
        assert call_id == waiter.call_id
        assert outcome.error is not None
        assert (outcome.error.kind, outcome.error.type, outcome.error.message) == (
            ErrorKind.WORKER_LOST,
            "WorkerLost",
            expected,
        )
    assert not client.exists(keys.claim(key))  # nothing stored: a retry in the run runs it again
    assert not client.exists(keys.state(key))
    assert (
        int(client.hget(keys.DEADLETTER_COUNT, "worker_lost") or 0) == int(entries_before or 0) + 1
    )
    entry = json.loads(client.lindex(keys.DEADLETTER, 0) or b"{}")
    assert (entry["reason"], entry["call_id"]) == ("worker_lost", call.call_id)
    assert 0 < client.pttl(keys.deliveries(call.call_id)) <= (60 + settings.claim_margin) * 1000


def test_a_limit_of_one_gives_up_at_the_first_loss(
    celery_app: Celery, settings: Settings, client: redis.Redis, exited_pid: int
) -> None:
    app = app_with(celery_app, settings, max_deliveries=1)
    call = make_call("search")
    request, acks = delivery(app, call, TASK_AT_LEAST_ONCE, exited_pid)

    request.on_failure(worker_lost())

    assert acks.events == ["ack"]
    outcome = next_reply(client, call.reply_to)[1]
    assert outcome.error is not None
    assert (
        outcome.error.message
        == "the worker process died 1 times running this call; it was given up"
    )


def test_an_at_most_once_loss_is_not_counted_and_still_reported_worker_lost_at_once(
    celery_app: Celery, settings: Settings, client: redis.Redis, exited_pid: int
) -> None:
    app = app_with(celery_app, settings, max_deliveries=1)
    call = make_call("search")
    request, acks = delivery(app, call, TASK_AT_MOST_ONCE, exited_pid)

    request.on_failure(worker_lost())

    assert acks.events == ["ack"]
    assert not client.exists(keys.deliveries(call.call_id))
    outcome = next_reply(client, call.reply_to)[1]
    assert outcome.error is not None and outcome.error.kind is ErrorKind.WORKER_LOST
    assert "died" in outcome.error.message and "times" not in outcome.error.message


def test_when_losses_cannot_be_counted_celery_requeues_as_it_would_without_a_limit(
    celery_app: Celery, settings: Settings, client: redis.Redis, exited_pid: int, closed_port: int
) -> None:
    unreachable = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{closed_port}/0"})
    app = app_with(celery_app, unreachable, max_deliveries=1)
    call = make_call("search")
    request, acks = delivery(app, call, TASK_AT_LEAST_ONCE, exited_pid)

    request.on_failure(worker_lost())

    assert acks.events == ["requeue"]
    assert no_reply(client, call.reply_to)


@pytest.mark.parametrize("task", [TASK_AT_MOST_ONCE, TASK_AT_LEAST_ONCE])
def test_a_child_that_retired_after_replying_is_acknowledged_and_nothing_more_is_reported(
    celery_app: Celery, settings: Settings, client: redis.Redis, exited_pid: int, task: str
) -> None:
    app = app_with(celery_app, settings)
    key = unique("key")
    call = make_call("book", idempotency_key=key)
    successor = holder("w2@host", 31337)  # a later delivery's marker stays
    client.set(keys.state(key), running_state(successor), ex=60)
    request, acks = delivery(app, call, task, exited_pid)

    request.on_failure(retired())

    assert acks.events == ["ack"]
    assert no_reply(client, call.reply_to)
    assert not client.exists(keys.deliveries(call.call_id))
    assert client.get(keys.state(key)) == running_state(successor).encode()
