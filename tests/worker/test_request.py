"""executor.seams.request: the task's Celery request frees the marker of a pool child that died.

The request is built as Celery's consumer builds it, from a kombu message in the
client's own format (:mod:`wire.message`), and taken by a pool child whose pid has
exited; ``on_failure`` then gets the ``WorkerLostError`` billiard reports for it.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from billiard.einfo import ExceptionInfo
from billiard.exceptions import WorkerLostError
from billiard.pool import ApplyResult
from celery import Celery
from celery.concurrency.base import BasePool
from celery.worker.request import Request, create_request_cls
from kombu.message import Message

from executor.seams import put_back
from executor.seams.celery_tasks import register_tasks
from executor.seams.request import release_dead_child, request_class
from executor.worker import holder
from wire import keys
from wire.formats import running_state, waiter_entry
from wire.message import encode_arguments, message_body, task_headers
from wire.models import TASK_AT_LEAST_ONCE, TASK_AT_MOST_ONCE, CallRequest, ErrorKind
from wire.settings import Settings

from .conftest import WORKER_HOSTNAME
from .support import make_call, next_reply, no_reply, unique


class Acks:
    """Records what the request did with its message (Celery's on_ack / on_reject callbacks)."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def ack(self, *_: Any) -> None:
        self.events.append("ack")

    def reject(self, _logger: Any, _errors: Any, requeue: bool = False) -> None:
        self.events.append("requeue" if requeue else "reject")


@pytest.fixture
def app(celery_app: Celery, settings: Settings) -> Celery:
    """Celery's test app with toolexec's tasks (and so their request class)."""
    register_tasks(celery_app, settings)
    return celery_app


def taken_request(app: Celery, call: CallRequest, task: str, acks: Acks, pid: int) -> Request:
    """The request of ``call``'s message, accepted by the pool child ``pid``."""
    message = Message(  # type: ignore[no-untyped-call]  # kombu is untyped
        body=message_body(call, encode_arguments(call.arguments)),
        headers=task_headers(call, task_name=task),
        content_type="application/json",
        content_encoding="utf-8",
        delivery_info={"exchange": "", "routing_key": "default"},
    )
    request_cls = app.tasks[task].Request
    request = request_cls(
        message, app=app, hostname=WORKER_HOSTNAME, on_ack=acks.ack, on_reject=acks.reject
    )
    request.on_accepted(pid, time.monotonic())
    return request


def worker_lost() -> ExceptionInfo:
    """What billiard reports for a child that died: ``WorkerLostError``, wrapped as
    ``ExceptionWithTraceback`` (as every billiard ExceptionInfo wraps its exception)."""
    try:
        raise WorkerLostError("Worker exited prematurely: signal 9 (SIGKILL) Job: 0.")
    except WorkerLostError:
        return ExceptionInfo()


def exited_itself(exc: BaseException) -> Callable[[], ExceptionInfo]:
    """billiard >= 4.3 reports a job's own SystemExit or KeyboardInterrupt as its result,
    then the child exits; Celery's Request.on_failure treats it as a lost worker."""

    def einfo() -> ExceptionInfo:
        try:
            raise exc
        except type(exc):
            return ExceptionInfo()

    return einfo


LOSSES: dict[str, Callable[[], ExceptionInfo]] = {
    "WorkerLostError": worker_lost,
    "SystemExit raised in the child": exited_itself(SystemExit(1)),
    "KeyboardInterrupt raised in the child": exited_itself(KeyboardInterrupt()),
}


def test_request_class_is_a_celery_request_and_both_tasks_use_it(
    app: Celery, settings: Settings
) -> None:
    assert issubclass(request_class(settings), Request)
    for task in (TASK_AT_MOST_ONCE, TASK_AT_LEAST_ONCE):
        cls = app.tasks[task].Request
        assert issubclass(cls, Request) and cls is not Request
        assert cls.on_failure is not Request.on_failure


def test_no_method_of_the_request_class_is_hidden_by_the_subclass_celerys_consumer_makes(
    app: Celery,
) -> None:
    # Celery's strategy runs each call through a subclass of the task's request class
    # (create_request_cls) that defines its own methods: one of the same name defined by
    # toolexec's class would never run in a worker.
    task = app.tasks[TASK_AT_MOST_ONCE]
    worker_request = create_request_cls(
        task.Request, task, DropsItsJobs(), WORKER_HOSTNAME, None, app=app
    )
    celerys = {name for name, value in vars(worker_request).items() if callable(value)}
    assert celerys >= {"execute_using_pool", "on_success"}  # what Celery 5.x defines there
    assert celerys.isdisjoint(vars(task.Request))


@pytest.mark.parametrize("loss", LOSSES)
def test_a_lost_at_most_once_call_frees_the_dead_childs_marker_and_is_reported_worker_lost(
    app: Celery, client: redis.Redis, exited_pid: int, loss: str
) -> None:
    key = unique("key")
    call = make_call("book", idempotency_key=key)
    client.set(keys.state(key), running_state(holder(WORKER_HOSTNAME, exited_pid)), ex=60)
    acks = Acks()
    request = taken_request(app, call, TASK_AT_MOST_ONCE, acks, exited_pid)

    request.on_failure(LOSSES[loss]())

    assert not client.exists(keys.state(key))
    # Celery's own on_failure ran: it reported the loss through the reply backend.
    call_id, outcome = next_reply(client, call.reply_to)
    assert call_id == call.call_id
    assert outcome.error is not None and outcome.error.kind is ErrorKind.WORKER_LOST
    assert acks.events == ["ack"]  # at most once: acknowledged when the child took it


def test_a_lost_at_most_once_call_that_callers_joined_tells_them_worker_lost_and_frees_its_key(
    app: Celery, client: redis.Redis, exited_pid: int
) -> None:
    key = unique("key")
    call, joiner = make_call("book", idempotency_key=key), make_call("book", idempotency_key=key)
    client.set(keys.claim(key), call.call_id, ex=60)
    client.set(
        keys.state(key), running_state(holder(WORKER_HOSTNAME, exited_pid), waiters=True), ex=60
    )
    client.rpush(keys.waiters(key), waiter_entry(joiner.reply_to, joiner.call_id))
    request = taken_request(app, call, TASK_AT_MOST_ONCE, Acks(), exited_pid)

    request.on_failure(worker_lost())

    for caller in (call, joiner):
        call_id, outcome = next_reply(client, caller.reply_to)
        assert call_id == caller.call_id
        assert outcome.error is not None and outcome.error.kind is ErrorKind.WORKER_LOST
    # Nothing stored, nothing held: a retry in the run claims the key and runs it again.
    assert not client.exists(keys.state(key), keys.claim(key), keys.waiters(key))


@pytest.mark.parametrize("loss", LOSSES)
def test_a_lost_at_least_once_call_frees_the_dead_childs_marker_before_celery_requeues_it(
    app: Celery, client: redis.Redis, exited_pid: int, loss: str
) -> None:
    key = unique("key")
    call = make_call("book", idempotency_key=key)
    client.set(keys.state(key), running_state(holder(WORKER_HOSTNAME, exited_pid)), ex=60)
    acks = Acks()
    request = taken_request(app, call, TASK_AT_LEAST_ONCE, acks, exited_pid)

    request.on_failure(LOSSES[loss]())

    assert not client.exists(keys.state(key))
    assert acks.events == ["requeue"]  # Celery's on_failure: rejected for redelivery...
    assert no_reply(client, call.reply_to)  # ...and so not reported to the caller


def test_a_lost_plain_call_frees_the_marker_the_heartbeat_wrote_under_its_call_id(
    app: Celery, client: redis.Redis, exited_pid: int
) -> None:
    call = make_call("search")
    client.set(keys.running(call.call_id), holder(WORKER_HOSTNAME, exited_pid), ex=60)
    request = taken_request(app, call, TASK_AT_MOST_ONCE, Acks(), exited_pid)

    request.on_failure(worker_lost())

    assert not client.exists(keys.running(call.call_id))
    assert next_reply(client, call.reply_to)[1].error is not None


def test_a_marker_another_holder_took_over_is_left_alone_and_celery_still_reports_the_loss(
    app: Celery, client: redis.Redis, exited_pid: int
) -> None:
    key = unique("key")
    call = make_call("book", idempotency_key=key)
    successor = holder("w2@host", 31337)
    client.set(keys.state(key), running_state(successor), ex=60)
    request = taken_request(app, call, TASK_AT_MOST_ONCE, Acks(), exited_pid)

    request.on_failure(worker_lost())

    assert client.get(keys.state(key)) == running_state(successor).encode()
    call_id, outcome = next_reply(client, call.reply_to)
    assert call_id == call.call_id
    assert outcome.error is not None and outcome.error.kind is ErrorKind.WORKER_LOST


def test_a_failure_that_is_not_a_lost_child_keeps_the_marker(
    app: Celery, client: redis.Redis, exited_pid: int
) -> None:
    key = unique("key")
    call = make_call("book", idempotency_key=key)
    tag = holder(WORKER_HOSTNAME, exited_pid)
    client.set(keys.state(key), running_state(tag), ex=60)
    request = taken_request(app, call, TASK_AT_MOST_ONCE, Acks(), exited_pid)

    try:
        raise RuntimeError("the pool could not send the result")
    except RuntimeError:
        request.on_failure(ExceptionInfo())

    assert client.get(keys.state(key)) == running_state(tag).encode()
    assert next_reply(client, call.reply_to)[1].error is not None


def test_release_dead_child_deletes_only_a_marker_the_tag_still_holds(
    client: redis.Redis, settings: Settings
) -> None:
    mine, theirs = (
        make_call("book", idempotency_key=unique("key")),
        make_call("book", idempotency_key=unique("key")),
    )
    tag = holder(WORKER_HOSTNAME, 4242)
    client.set(keys.state(mine.idempotency_key or ""), running_state(tag), ex=60)
    client.set(
        keys.state(theirs.idempotency_key or ""),
        running_state(holder(WORKER_HOSTNAME, 4343)),
        ex=60,
    )

    assert release_dead_child(mine.model_dump(mode="json"), settings=settings, tag=tag) is True
    assert release_dead_child(theirs.model_dump(mode="json"), settings=settings, tag=tag) is False

    assert not client.exists(keys.state(mine.idempotency_key or ""))
    assert client.exists(keys.state(theirs.idempotency_key or ""))


def test_release_dead_child_never_raises_so_celerys_own_handling_still_runs(
    settings: Settings, caplog: pytest.LogCaptureFixture, closed_port: int
) -> None:
    unreachable = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{closed_port}/0"})
    call = make_call("book", idempotency_key=unique("key"))
    # Celery's in-process worker sets the root level to ERROR; capture this logger's warnings.
    caplog.set_level(logging.WARNING, logger="executor.seams.request")

    assert release_dead_child({"tool": "book"}, settings=settings, tag="w|1") is False
    assert release_dead_child(None, settings=settings, tag="w|1") is False
    assert (
        release_dead_child(call.model_dump(mode="json"), settings=unreachable, tag="w|1") is False
    )
    assert [r.getMessage() for r in caplog.records] == [
        "could not release the marker of a lost call: ValidationError",
        "could not release the marker of a lost call: ValidationError",
        "could not release the marker of a lost call: ConnectionError",
    ]


class DropsItsJobs(BasePool):  # type: ignore[misc]  # Celery is untyped
    """Celery's pool base with billiard's own jobs (``ApplyResult``) in a cache it may
    clear, as the prefork pool's ``AsynPool.flush`` discards the jobs it wrote to a child
    when the broker connection breaks."""

    def __init__(self) -> None:
        super().__init__(limit=1)
        self.cache: dict[int, ApplyResult] = {}

    def on_apply(self, *_: Any, callback: Any = None, **options: Any) -> ApplyResult:
        return ApplyResult(self.cache, callback, accept_callback=options.get("accept_callback"))


@pytest.mark.parametrize("written", [True, False], ids=["written", "not-written"])
def test_a_job_whose_writing_to_a_child_began_counts_as_started_once_the_pool_dropped_it(
    app: Celery, written: bool
) -> None:
    # A put-back at the connection's close asks the ledger whether each call taken started: one
    # written to a prefork child runs there, so putting it back would run it twice.
    tag = unique("delivery")
    call = make_call("book")
    message = Message(  # type: ignore[no-untyped-call]  # kombu is untyped
        body=message_body(call, encode_arguments(call.arguments)),
        headers=task_headers(call, task_name=TASK_AT_MOST_ONCE),
        content_type="application/json",
        content_encoding="utf-8",
        delivery_info={"exchange": "", "routing_key": "default"},
        delivery_tag=tag,
    )
    acks = Acks()
    pool = DropsItsJobs()
    # The class Celery's strategy makes of the task's request class for its consumer,
    # whose own execute_using_pool hands the call over (celery.worker.strategy).
    task = app.tasks[TASK_AT_MOST_ONCE]
    worker_request = create_request_cls(task.Request, task, pool, WORKER_HOSTNAME, None, app=app)
    request = worker_request(
        message, app=app, hostname=WORKER_HOSTNAME, on_ack=acks.ack, on_reject=acks.reject
    )
    request.execute_using_pool(pool)
    (job,) = pool.cache.values()
    if written:
        job._write_to = object()  # what AsynPool sets as it begins writing the job
    del job
    pool.cache.clear()
    gc.collect()

    assert put_back.LEDGER.started(tag) is written
    assert acks.events == []  # neither acknowledged nor rejected: the child's to answer
