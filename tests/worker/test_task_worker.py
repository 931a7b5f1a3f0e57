"""The task body on Celery's in-process worker: a sent call becomes a reply frame.

Each call goes through Celery for real (the memory broker, the worker's consumer and
strategy, the task's request class and tracer) and its outcome is read back from the
private Redis, as the client's reply listener would.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from celery import Celery

from executor.task import run_call
from executor.worker import holder, worker_id
from wire import keys
from wire.formats import (
    KeyState,
    holder_tag,
    parse_state,
    running_state,
    stored_state,
    waiter_entry,
)
from wire.message import encode_arguments, message_body, task_headers
from wire.models import TASK_AT_LEAST_ONCE, TASK_AT_MOST_ONCE, CallOutcome, CallRequest, ErrorKind
from wire.settings import Settings

from .conftest import WORKER_HOSTNAME, Register
from .support import make_call, next_reply, no_reply, unique, wait_until

pytestmark = pytest.mark.usefixtures("celery_session_worker")


def send(app: Celery, call: CallRequest, task: str = TASK_AT_MOST_ONCE, **options: Any) -> None:
    """Send ``call`` as the task's keyword arguments, with the call id as the task id."""
    app.send_task(task, kwargs=call.model_dump(mode="json"), task_id=call.call_id, **options)


def counting_add(runs: list[tuple[int, int]]) -> Any:
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        runs.append((a, b))
        return a + b

    return add


@pytest.mark.parametrize("task", [TASK_AT_MOST_ONCE, TASK_AT_LEAST_ONCE])
def test_a_call_sent_to_the_worker_runs_the_tool_and_its_outcome_arrives_on_the_reply_list(
    celery_session_app: Celery,
    client: redis.Redis,
    register: Register,
    settings: Settings,
    task: str,
) -> None:
    runs: list[tuple[int, int]] = []
    call = make_call(register(counting_add(runs)), arguments={"a": 2, "b": 3})

    send(celery_session_app, call, task)

    assert wait_until(lambda: client.exists(keys.reply(call.reply_to)))
    assert 0 < client.ttl(keys.reply(call.reply_to)) <= settings.reply_ttl
    call_id, outcome = next_reply(client, call.reply_to)
    assert call_id == call.call_id
    assert outcome == CallOutcome.success(call.call_id, 5, worker=WORKER_HOSTNAME)
    assert runs == [(2, 3)]


def test_a_call_in_the_clients_own_message_format_is_run_by_the_worker(
    celery_session_app: Celery, client: redis.Redis, register: Register
) -> None:
    runs: list[tuple[int, int]] = []
    call = make_call(
        register(counting_add(runs)), arguments={"a": 40, "b": 2}, deadline=time.time() + 30
    )
    headers = task_headers(call, task_name=TASK_AT_MOST_ONCE)
    body = message_body(call, encode_arguments(call.arguments))

    with celery_session_app.producer_or_acquire() as producer:
        producer.publish(
            body,
            routing_key=celery_session_app.conf.task_default_queue,
            headers=headers,
            content_type="application/json",
            content_encoding="utf-8",
        )

    call_id, outcome = next_reply(client, call.reply_to)
    assert (call_id, outcome.ok, outcome.result) == (call.call_id, True, 42)
    assert runs == [(40, 2)]


def test_an_expired_call_is_refused_as_expired_and_its_tool_never_runs(
    celery_session_app: Celery, client: redis.Redis, register: Register
) -> None:
    runs: list[tuple[int, int]] = []
    name = register(counting_add(runs))
    call = make_call(name, arguments={"a": 1, "b": 1}, deadline=time.time() - 1)

    send(celery_session_app, call)

    call_id, outcome = next_reply(client, call.reply_to)
    assert call_id == call.call_id
    assert outcome.error is not None
    assert outcome.error.kind is ErrorKind.EXPIRED
    assert name in outcome.error.message  # the task body's refusal, which names the tool
    assert runs == []


def test_a_message_celery_drops_as_expired_is_reported_expired_by_the_reply_backend(
    celery_session_app: Celery, client: redis.Redis, register: Register
) -> None:
    runs: list[tuple[int, int]] = []
    # No deadline in the call: only Celery's own expiry check (in the consumer, before
    # the task body) can refuse it, and only the reply backend can tell the caller.
    call = make_call(register(counting_add(runs)), arguments={"a": 1, "b": 1})

    send(celery_session_app, call, expires=datetime.now(UTC) - timedelta(seconds=1))

    call_id, outcome = next_reply(client, call.reply_to)
    assert call_id == call.call_id
    assert outcome == CallOutcome.failure(
        call.call_id,
        ErrorKind.EXPIRED,
        "DeadlineExpired",
        "the deadline passed before a worker started this call",
        worker=WORKER_HOSTNAME,
    )
    assert runs == []


def test_a_malformed_message_is_dropped_without_stopping_the_worker_and_the_next_call_runs(
    celery_session_app: Celery,
    client: redis.Redis,
    register: Register,
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs: list[tuple[int, int]] = []
    name = register(counting_add(runs))
    malformed_reply_to = unique("client")
    call = make_call(name, arguments={"a": 3, "b": 4})

    with caplog.at_level(logging.ERROR, logger="executor.task"):
        celery_session_app.send_task(
            TASK_AT_MOST_ONCE,
            kwargs={"tool": name, "arguments": {"a": 1, "b": 2}, "reply_to": malformed_reply_to},
        )
        send(celery_session_app, call)
        call_id, outcome = next_reply(client, call.reply_to)

    assert (call_id, outcome.result) == (call.call_id, 7)
    assert runs == [(3, 4)]
    assert no_reply(client, malformed_reply_to)
    assert any("dropped a malformed toolexec message" in r.getMessage() for r in caplog.records)


def test_a_call_to_a_tool_this_worker_does_not_have_is_answered_not_found(
    celery_session_app: Celery, client: redis.Redis
) -> None:
    call = make_call(unique("no-such-tool"))

    send(celery_session_app, call)

    call_id, outcome = next_reply(client, call.reply_to)
    assert call_id == call.call_id
    assert outcome.error is not None
    assert (outcome.error.kind, outcome.error.type) == (ErrorKind.NOT_FOUND, "ToolNotFound")


def test_an_idempotent_call_whose_outcome_is_stored_is_answered_from_the_store_without_running(
    celery_session_app: Celery, client: redis.Redis, register: Register
) -> None:
    runs: list[tuple[int, int]] = []
    name = register(counting_add(runs), idempotent=True)
    key = unique("key")
    stored = CallOutcome.success("the-first-call", 99, worker="another@host")
    client.set(keys.state(key), stored_state(stored.model_dump_json()), ex=60)
    call = make_call(name, arguments={"a": 1, "b": 1}, idempotency_key=key)
    client.set(keys.claim(key), call.call_id, ex=60)  # the client's claim

    send(celery_session_app, call, TASK_AT_LEAST_ONCE)

    call_id, outcome = next_reply(client, call.reply_to)
    assert call_id == call.call_id
    assert (outcome.ok, outcome.result, outcome.worker) == (True, 99, "another@host")
    assert runs == []
    # The claim stands: while it lasts, a repeat is answered by the claim script alone.
    assert client.get(keys.claim(key)) == call.call_id.encode()
    assert parse_state(client.get(keys.state(key))) == KeyState(outcome=stored.model_dump_json())


def test_an_idempotent_call_held_by_a_live_delivery_joins_it_and_gets_its_outcome_when_it_completes(
    celery_session_app: Celery, client: redis.Redis, register: Register, settings: Settings
) -> None:
    started, release = threading.Event(), threading.Event()
    runs: list[int] = []

    def book(seat: int) -> str:
        """Book a seat."""
        runs.append(seat)
        started.set()
        assert release.wait(10)
        return f"seat {seat}"

    name = register(book, idempotent=True)
    key = unique("key")
    first = make_call(name, arguments={"seat": 7}, idempotency_key=key)
    second = make_call(name, arguments={"seat": 7}, idempotency_key=key)
    # The first delivery runs on another worker, alive: its heartbeat is in Redis.
    other = unique("other") + "@host"
    client.set(keys.worker(worker_id(other)), "{}", ex=60)
    results: list[CallOutcome | None] = []
    thread = threading.Thread(
        target=lambda: results.append(
            run_call(first.model_dump(mode="json"), settings=settings, worker=other)
        )
    )
    thread.start()
    try:
        assert started.wait(5)
        send(celery_session_app, second, TASK_AT_LEAST_ONCE)

        joined = waiter_entry(second.reply_to, second.call_id).encode()
        assert wait_until(lambda: joined in client.lrange(keys.waiters(key), 0, -1))
        assert runs == [7]
        assert no_reply(client, second.reply_to)
    finally:
        release.set()
        thread.join(10)

    first_outcome = CallOutcome.success(first.call_id, "seat 7", worker=other)
    assert results == [first_outcome]
    assert next_reply(client, first.reply_to) == (first.call_id, first_outcome)
    call_id, outcome = next_reply(client, second.reply_to)
    assert (call_id, outcome.result) == (second.call_id, "seat 7")
    assert runs == [7]
    assert parse_state(client.get(keys.state(key))) == KeyState(
        outcome=first_outcome.model_dump_json()
    )


@pytest.mark.parametrize(
    "holder_is", ["another worker without a heartbeat", "an exited process of this worker"]
)
def test_an_idempotent_call_whose_holder_is_dead_is_taken_over_and_run(
    celery_session_app: Celery,
    client: redis.Redis,
    register: Register,
    exited_pid: int,
    holder_is: str,
) -> None:
    runs: list[tuple[int, int]] = []
    name = register(counting_add(runs), idempotent=True)
    key = unique("key")
    if holder_is == "an exited process of this worker":
        dead = holder(WORKER_HOSTNAME, exited_pid)
    else:
        dead = holder_tag(worker_id(unique("gone") + "@host"), 4242)
    client.set(keys.state(key), running_state(dead), ex=60)
    call = make_call(name, arguments={"a": 5, "b": 6}, idempotency_key=key)

    send(celery_session_app, call, TASK_AT_LEAST_ONCE)

    call_id, outcome = next_reply(client, call.reply_to)
    assert (call_id, outcome.ok, outcome.result) == (call.call_id, True, 11)
    assert runs == [(5, 6)]
    assert (
        CallOutcome.model_validate_json(
            parse_state(client.get(keys.state(key))).outcome or ""
        ).result
        == 11
    )
