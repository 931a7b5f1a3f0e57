"""The worker's start-up lockdown, piece by piece: JSON only, toolexec's tasks only,
Redis errors that name their cause, and Celery's failure records without tool data."""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from billiard.exceptions import WorkerLostError
from celery import Celery

from executor.seams.lockdown import (
    TOOLEXEC_TASKS,
    broker_ssl_options,
    check_connections,
    check_json_only,
    json_only_problems,
    restrict_tasks,
    withhold_message_bodies,
)
from toolexec import free_port
from wire.errors import ConfigurationError
from wire.redis_errors import explain, is_misconfiguration, tls_refusal

JSON_ONLY = {
    "accept_content": ["json"],
    "result_accept_content": ["json"],
    "task_serializer": "json",
    "result_serializer": "json",
    "event_serializer": "json",
}


def test_the_settings_toolexec_writes_are_json_only() -> None:
    assert json_only_problems(JSON_ONLY) == []
    assert (
        json_only_problems(
            {**JSON_ONLY, "accept_content": ("application/json",), "result_accept_content": None}
        )
        == []
    )


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("accept_content", ["pickle", "json"]),
        ("accept_content", "pickle"),
        ("accept_content", []),
        ("accept_content", ["application/x-python-serialize"]),
        ("result_accept_content", ["json", "yaml"]),
        ("task_serializer", "pickle"),
        ("result_serializer", "msgpack"),
        ("event_serializer", "pickle"),
    ],
)
def test_any_serializer_but_json_is_a_problem_that_names_the_setting(
    setting: str, value: Any
) -> None:
    problems = json_only_problems({**JSON_ONLY, setting: value})

    assert problems == [f"{setting}={value!r}"]
    with pytest.raises(
        ConfigurationError, match=f"JSON only.*{setting}=.*pickled message runs code"
    ):
        check_json_only({**JSON_ONLY, setting: value})


@pytest.fixture
def app() -> Iterator[Celery]:
    """A Celery app with tasks named as toolexec's two, and Celery's built-ins.

    Not ``register_tasks``: its tasks are shared with every app made later in the
    session (Celery's ``shared=True``), which would register them twice elsewhere.
    """
    celery_app = Celery("lockdown-test", set_as_current=False)
    for name in TOOLEXEC_TASKS:

        def body() -> None:
            """Stands in for toolexec's task."""

        celery_app.task(name=name, shared=False)(body)
    yield celery_app
    celery_app.close()


def test_restricting_leaves_only_toolexecs_two_tasks(app: Celery) -> None:
    before = set(app.tasks)
    removed = restrict_tasks(app)

    assert {
        "celery.backend_cleanup",
        "celery.chain",
        "celery.group",
        "celery.chord_unlock",
    } <= before
    assert set(removed) == before - TOOLEXEC_TASKS
    assert set(app.tasks) == TOOLEXEC_TASKS


def test_a_shared_task_that_a_tool_modules_imports_brought_in_is_not_served(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    @app.task(name="library.cleanup", shared=False)
    def cleanup() -> None:
        """A task some imported library defines."""

    caplog.set_level(logging.WARNING, logger="executor.seams.lockdown")
    removed = restrict_tasks(app)

    assert "library.cleanup" in removed
    assert set(app.tasks) == TOOLEXEC_TASKS
    assert "not serving Celery tasks that are not toolexec's: " in caplog.text
    assert "library.cleanup" in caplog.text


def test_a_rediss_broker_without_ssl_parameters_checks_the_certificate() -> None:
    assert broker_ssl_options("rediss://redis.example:6380/0") == {
        "ssl_cert_reqs": ssl.CERT_REQUIRED
    }
    assert (
        broker_ssl_options("rediss://h:6380/0?ssl_cert_reqs=required&ssl_ca_certs=/ca.pem") is None
    )
    assert broker_ssl_options("redis://h:6379/0") is None


def test_an_unreachable_redis_does_not_stop_the_worker_it_waits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"redis://user:s3cret@127.0.0.1:{free_port()}/0"
    caplog.set_level(logging.WARNING, logger="executor.seams.lockdown")

    check_connections({"TOOLEXEC_BROKER_URL": url, "TOOLEXEC_OTHER": "memory://"}, timeout=1)

    assert "TOOLEXEC_BROKER_URL" in caplog.text and "cannot be reached yet" in caplog.text
    assert "s3cret" not in caplog.text


@pytest.mark.parametrize(
    ("exc", "cause", "fatal"),
    [
        (
            redis.AuthenticationError("invalid username-password pair or user is disabled."),
            "authentication failed",
            True,
        ),
        (
            redis.ResponseError("WRONGPASS invalid username-password pair"),
            "authentication failed",
            True,
        ),
        (
            redis.exceptions.NoPermissionError("NOPERM this user has no permissions"),
            "not allowed",
            True,
        ),
        (
            redis.ConnectionError(
                "Error 1 connecting. [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"
            ),
            "TLS certificate verify failed",
            True,
        ),
        (
            redis.ConnectionError(
                "Error 8 while writing to socket. EOF occurred in violation of protocol "
                "(_ssl.c:2427)."
            ),
            "the server closed the TLS connection as it opened",
            True,
        ),
        (
            redis.ConnectionError(
                "Error 1 connecting. [SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1000)"
            ),
            "the server does not speak TLS on this port",
            True,
        ),
        (
            redis.ConnectionError("Error 1 connecting. [SSL] unexpected message"),
            "TLS handshake failed",
            False,
        ),
        (
            redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused."),
            "Connection refused",
            False,
        ),
    ],
)
def test_redis_errors_lead_with_their_cause(exc: Exception, cause: str, fatal: bool) -> None:
    assert explain(exc).startswith(cause) or cause in explain(exc)
    assert str(exc) in explain(exc)
    assert is_misconfiguration(exc) is fatal


def test_a_certificate_alert_in_the_exceptions_chain_names_the_refused_client_certificate() -> None:
    try:
        try:
            raise ssl.SSLError(
                1, "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required"
            )
        except ssl.SSLError as alert:
            raise redis.ConnectionError("Error while reading from socket: closed") from alert
    except redis.ConnectionError as exc:
        refused = exc

    assert explain(refused).startswith(
        "the server refused this client's TLS certificate (its alert: certificate required)"
    )
    assert "ssl_certfile and ssl_keyfile" in explain(refused)
    assert is_misconfiguration(refused)


def test_a_tls_probe_is_made_only_for_a_dropped_rediss_connection() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(0)
        port = listener.getsockname()[1]

        def probed(scheme: str, failure: str) -> bool:
            # The listener never answers the TLS hello: the probe gives up, having seen no refusal.
            assert tls_refusal(f"{scheme}://127.0.0.1:{port}/0", failure, timeout=0.2) is None
            try:
                connection, _ = listener.accept()
            except BlockingIOError:
                return False
            connection.close()
            return True

        assert not probed("redis", "Connection reset by peer")
        assert not probed("rediss", "Timeout reading from socket")
        assert probed(
            "rediss", "Error while reading from 127.0.0.1:6380 : (104, 'Connection reset by peer')"
        )


SECRET = "4111-1111-1111-1111"


def _record(
    logger_name: str, msg: str, args: Any, *, exc: BaseException | None = None
) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc is not None else None
    record = logging.LogRecord(logger_name, logging.ERROR, __file__, 1, msg, None, exc_info)
    record.args = args
    return record


def _apply(record: logging.LogRecord) -> str:
    withhold_message_bodies()
    for flt in logging.getLogger(record.name).filters:
        flt.filter(record)
    return logging.Formatter().format(record)


def test_celerys_record_of_a_failed_toolexec_task_keeps_the_type_not_the_message() -> None:
    from celery.app import trace

    error = ValueError(f"card {SECRET} declined")
    record = _record(
        trace.logger.name,
        trace.LOG_FAILURE.strip(),
        {
            "name": "toolexec.run_tool",
            "id": "c1",
            "description": "raised unexpected",
            "exc": repr(error),
        },
        exc=error,
    )
    text = _apply(record)

    assert "toolexec.run_tool[c1] raised unexpected: ValueError(<withheld>)" in text
    assert SECRET not in text


def test_the_same_context_attached_as_record_data_is_withheld_too() -> None:
    from celery.app import trace

    error = ValueError(f"card {SECRET} declined")
    context = {
        "hostname": "w1",
        "id": "c3",
        "name": "toolexec.run_tool",
        "exc": repr(error),
        "traceback": f"Traceback ...\nValueError: card {SECRET} declined",
        "args": "[]",
        "kwargs": f"{{'arguments': {{'card': '{SECRET}'}}}}",
        "description": "raised unexpected",
        "internal": False,
    }
    record = _record(trace.logger.name, trace.LOG_FAILURE.strip(), context, exc=error)
    record.data = context  # what celery.app.trace passes as extra={"data": context}
    _apply(record)

    assert SECRET not in repr(record.data) and SECRET not in repr(record.args)
    assert record.data["exc"] == "ValueError(<withheld>)"
    assert record.data["id"] == "c3" and record.data["name"] == "toolexec.run_tool"


def test_a_failure_of_another_task_is_left_as_celery_logs_it() -> None:
    from celery.app import trace

    record = _record(
        trace.logger.name,
        trace.LOG_FAILURE.strip(),
        {
            "name": "mine.task",
            "id": "c2",
            "description": "raised unexpected",
            "exc": "ValueError('x')",
        },
    )

    assert "ValueError('x')" in _apply(record)


def test_the_main_processs_report_of_a_pool_failure_withholds_all_but_billiards_words() -> None:
    lost = WorkerLostError("Worker exited prematurely: signal 9 (SIGKILL).")
    leaked = _apply(
        _record("celery.worker.request", "Task handler raised error: %r", (SystemExit(SECRET),))
    )
    kept = _apply(
        _record("celery.worker.request", "Task handler raised error: %r", (lost,), exc=lost)
    )

    assert SECRET not in leaked and "SystemExit(<withheld>)" in leaked
    assert "signal 9 (SIGKILL)" in kept
