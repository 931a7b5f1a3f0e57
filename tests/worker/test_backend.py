"""executor.seams.backend.ReplyBackend: what Celery's main process reports becomes an outcome.

Celery calls the backend with the request's context as ``request``; all the backend
reads of it is ``.kwargs`` and ``.hostname``, so a plain namespace stands in for it.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import redis
from billiard.exceptions import TimeLimitExceeded, WorkerLostError
from celery import Celery

from executor.errors import DeliveriesExhausted, StoreUnavailable
from executor.seams.backend import ReplyBackend
from wire import keys
from wire.formats import parse_state
from wire.models import CallOutcome, CallRequest, ErrorKind
from wire.settings import Settings

from .conftest import Register
from .support import make_call, next_reply, no_reply, unique

HOST = "w1@host"


@pytest.fixture
def backend(celery_app: Celery, settings: Settings) -> ReplyBackend:
    """The backend as :func:`executor.seams.celery_tasks.register_tasks` builds it."""
    return ReplyBackend(app=celery_app, settings=settings)


def context(call: CallRequest) -> SimpleNamespace:
    """What Celery passes as ``request``: the task's keyword arguments and the worker's name."""
    return SimpleNamespace(kwargs=call.model_dump(mode="json"), hostname=HOST)


@pytest.mark.parametrize(
    ("exc", "kind", "type_name"),
    [
        (
            WorkerLostError("Worker exited prematurely: signal 9 (SIGKILL)."),
            ErrorKind.WORKER_LOST,
            "WorkerLost",
        ),
        (TimeLimitExceeded(30.0), ErrorKind.HARD_TIMEOUT, "ToolHardTimeout"),
        (StoreUnavailable(10.0, ConnectionError("gone")), ErrorKind.WORKER_LOST, "WorkerLost"),
        (DeliveriesExhausted(3), ErrorKind.WORKER_LOST, "WorkerLost"),
        (RuntimeError("pool failure"), ErrorKind.EXECUTION, "RuntimeError"),
    ],
)
def test_a_failure_celery_reports_reaches_the_caller_as_an_outcome_of_its_kind(
    backend: ReplyBackend, client: redis.Redis, exc: BaseException, kind: ErrorKind, type_name: str
) -> None:
    call = make_call("search")

    backend.mark_as_failure(call.call_id, exc, request=context(call), store_result=False)

    call_id, outcome = next_reply(client, call.reply_to)
    assert call_id == call.call_id
    assert (outcome.call_id, outcome.ok, outcome.worker) == (call.call_id, False, HOST)
    assert outcome.error is not None
    assert (outcome.error.kind, outcome.error.type) == (kind, type_name)
    assert str(exc) in outcome.error.message


@pytest.mark.parametrize(
    ("reason", "kind", "type_name"),
    [
        ("expired", ErrorKind.EXPIRED, "DeadlineExpired"),
        ("terminated", ErrorKind.WORKER_LOST, "Revoked"),
    ],
)
def test_a_revoked_call_reaches_the_caller_as_expired_or_lost(
    backend: ReplyBackend, client: redis.Redis, reason: str, kind: ErrorKind, type_name: str
) -> None:
    call = make_call("search")

    backend.mark_as_revoked(call.call_id, reason, request=context(call), store_result=False)

    call_id, outcome = next_reply(client, call.reply_to)
    assert call_id == call.call_id
    assert outcome.error is not None
    assert (outcome.error.kind, outcome.error.type) == (kind, type_name)


@pytest.mark.parametrize(
    "request_",
    [
        SimpleNamespace(kwargs={"tool": "search", "reply_to": "client-malformed"}, hostname=HOST),
        SimpleNamespace(kwargs=None, hostname=HOST),
        None,
    ],
    ids=["kwargs without a call id", "no kwargs", "no request"],
)
def test_a_request_without_a_valid_call_is_logged_and_nothing_is_pushed(
    backend: ReplyBackend, client: redis.Redis, caplog: pytest.LogCaptureFixture, request_: object
) -> None:
    with caplog.at_level(logging.WARNING, logger="executor.seams.backend"):
        backend.mark_as_failure("task-1", WorkerLostError("gone"), request=request_)
        backend.mark_as_revoked("task-1", "expired", request=request_)

    assert no_reply(client, "client-malformed")
    assert [r.getMessage() for r in caplog.records] == [
        "call task-1 ended (worker_lost) but its message names no caller",
        "call task-1 ended (expired) but its message names no caller",
    ]


@pytest.mark.parametrize(
    ("exc", "stored"),
    [(TimeLimitExceeded(5.0), True), (WorkerLostError("gone"), False)],
    ids=["hard timeout", "lost worker"],
)
def test_an_idempotent_calls_failure_is_stored_only_when_its_tool_caches_errors_of_that_kind(
    backend: ReplyBackend, client: redis.Redis, register: Register, exc: BaseException, stored: bool
) -> None:
    def slow() -> None:
        """Never fast enough."""

    key = unique("key")
    call = make_call(register(slow, idempotent=True, cache_errors=True), idempotency_key=key)
    client.set(keys.claim(key), call.call_id, ex=60)

    backend.mark_as_failure(call.call_id, exc, request=context(call))

    call_id, outcome = next_reply(client, call.reply_to)
    assert call_id == call.call_id
    record = parse_state(client.get(keys.state(key))).outcome
    assert (record is not None) is stored
    if record is not None:
        assert CallOutcome.model_validate_json(record) == outcome
    assert bool(client.exists(keys.claim(key))) is stored
