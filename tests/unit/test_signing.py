"""Message signing: the client's signature verifies on the worker, and nothing else does."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_client.prepare import PreparedCall, prepare_call
from agent_client.validation import ArgumentValidator
from wire.errors import ConfigurationError
from wire.models import TASK_AT_LEAST_ONCE, TASK_AT_MOST_ONCE, ToolSpec
from wire.settings import Settings
from wire.signing import SIGNATURE_HEADER, sign, verify

KEY = "k" * 32
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"query": {}, "n": {}},
    "additionalProperties": True,
}
SPEC = ToolSpec(name="search", description="d", parameters=SCHEMA)


def prepared(
    arguments: dict[str, Any], *, key: str | None = KEY, spec: ToolSpec = SPEC, **options: Any
) -> PreparedCall:
    """A call as the client prepares it, with ``key`` as TOOLEXEC_SIGNING_KEY."""
    env = {"TOOLEXEC_SIGNING_KEY": key} if key is not None else {}
    config = Settings.from_env(env)
    values: dict[str, Any] = {
        "call_id": "client-1",
        "reply_to": "client",
        "timeout": 30.0,
        "run_id": None,
        "idempotency_key": None,
        "origin": "test",
    }
    values.update(options)
    validator = ArgumentValidator(spec.name, spec.parameters, max_bytes=config.max_argument_bytes)
    return prepare_call(spec, arguments, validator=validator, settings=config, **values)


def on_the_worker(call: PreparedCall) -> tuple[str, Any, dict[str, Any]]:
    """(task name, signature header, keyword arguments) as a worker decodes the message."""
    envelope = json.loads(call.envelope)
    _args, kwargs, _embed = json.loads(base64.b64decode(envelope["body"]))
    headers = envelope["headers"]
    return headers["task"], headers.get(SIGNATURE_HEADER), kwargs


def headers_of(call: PreparedCall) -> dict[str, Any]:
    """The message's headers as a worker decodes them (Celery's task request holds them)."""
    headers: dict[str, Any] = json.loads(call.envelope)["headers"]
    return headers


def test_a_signed_call_verifies_on_the_worker() -> None:
    call = prepared({"query": "fox", "n": 3})
    task, signature, fields = on_the_worker(call)

    assert isinstance(signature, str) and len(signature) == 64
    assert verify(KEY, signature, task, fields, headers=headers_of(call)) is None


def test_without_a_key_the_client_adds_no_header() -> None:
    call = prepared({"query": "fox"}, key=None)
    task, signature, fields = on_the_worker(call)

    assert signature is None
    assert verify(KEY, signature, task, fields, headers=headers_of(call)) == "unsigned"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tool", "book_flight"),
        ("call_id", "client-2"),
        ("reply_to", "attacker"),
        ("deadline", None),
        ("run_id", "run-x"),
        ("idempotency_key", "k-x"),
        ("arguments", {"query": "fox", "n": 4}),
        ("arguments", {"query": "fox", "n": 3, "extra": True}),
    ],
)
def test_changing_any_field_the_worker_acts_on_breaks_the_signature(field: str, value: Any) -> None:
    call = prepared({"query": "fox", "n": 3})
    task, signature, fields = on_the_worker(call)

    assert (
        verify(KEY, signature, task, {**fields, field: value}, headers=headers_of(call))
        == "signature_mismatch"
    )


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("timelimit", [None, None]),  # Celery's hard limit removed
        ("timelimit", [86_400.0, None]),  # or raised
        ("expires", "2999-01-01T00:00:00+00:00"),  # expiry moved
        ("expires", None),
        ("id", "another-call"),
        ("eta", "2999-01-01T00:00:00+00:00"),
        ("expires", 12),  # what only a forged message holds: refused, not raised
    ],
)
def test_changing_a_header_that_decides_how_celery_runs_it_breaks_the_signature(
    header: str, value: Any
) -> None:
    call = prepared({"query": "fox"}, spec=SPEC.model_copy(update={"hard_timeout": 5.0}))
    task, signature, fields = on_the_worker(call)
    headers = headers_of(call)
    assert headers["timelimit"] == [6.0, None] and headers["expires"] is not None

    assert (
        verify(KEY, signature, task, fields, headers={**headers, header: value})
        == "signature_mismatch"
    )


def test_the_same_expiry_written_as_other_text_still_verifies() -> None:
    from datetime import datetime

    call = prepared({"query": "fox"})
    task, signature, fields = on_the_worker(call)
    headers = headers_of(call)
    as_datetime = datetime.fromisoformat(headers["expires"])  # what send_task may write instead

    assert verify(KEY, signature, task, fields, headers={**headers, "expires": as_datetime}) is None
    assert (
        verify(KEY, signature, task, fields, headers={**headers, "argsrepr": "(1,)", "origin": "x"})
        is None
    )


def test_the_signature_binds_the_delivery_mode() -> None:
    call = prepared({"query": "fox"})
    task, signature, fields = on_the_worker(call)
    other = TASK_AT_LEAST_ONCE if task == TASK_AT_MOST_ONCE else TASK_AT_MOST_ONCE

    assert verify(KEY, signature, other, fields, headers=headers_of(call)) == "signature_mismatch"


def test_another_key_or_a_garbled_signature_does_not_verify() -> None:
    call = prepared({"query": "fox"})
    task, signature, fields = on_the_worker(call)
    headers = headers_of(call)
    garbled = signature[:-1] + ("0" if signature[-1] != "0" else "1")

    assert verify("x" * 32, signature, task, fields, headers=headers) == "signature_mismatch"
    assert verify(KEY, garbled, task, fields, headers=headers) == "signature_mismatch"
    assert verify(KEY, 42, task, fields, headers=headers) == "unsigned"
    assert verify(KEY, "", task, fields, headers=headers) == "unsigned"


def test_fields_a_forged_message_may_hold_are_refused_without_raising() -> None:
    call = prepared({"query": "fox"})
    task, signature, fields = on_the_worker(call)
    headers = headers_of(call)

    assert (
        verify(KEY, signature, task, {**fields, "arguments": {"x": b"bytes"}}, headers=headers)
        == "signature_mismatch"
    )
    assert (
        verify(KEY, signature, task, {**fields, "deadline": float("nan")}, headers=headers)
        == "signature_mismatch"
    )
    deep: Any = []
    for _ in range(5000):
        deep = [deep]
    assert (
        verify(KEY, signature, task, {**fields, "arguments": {"x": deep}}, headers=headers)
        == "signature_mismatch"
    )
    assert (
        verify(KEY, signature, task, fields, headers={**headers, "timelimit": [deep, None]})
        == "signature_mismatch"
    )


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(
    arguments=st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=5),
    timeout=st.none() | st.floats(min_value=0.001, max_value=1e6),
    run_id=st.none() | st.text(min_size=1, max_size=20),
)
def test_any_call_the_client_can_send_verifies_after_the_json_round_trip(
    arguments: dict[str, Any], timeout: float | None, run_id: str | None
) -> None:
    try:
        call = prepared(arguments, timeout=timeout, run_id=run_id)
    except Exception as exc:  # noqa: BLE001 - only arguments JSON cannot carry are refused
        assert type(exc).__name__ == "ToolArgumentsInvalid", exc
        return
    task, signature, fields = on_the_worker(call)

    assert verify(KEY, signature, task, fields, headers=headers_of(call)) is None


def test_sign_is_the_hmac_the_header_carries() -> None:
    call = prepared({"query": "fox"}, run_id="run-1")
    task, signature, _fields = on_the_worker(call)
    request = call.request

    assert signature == sign(
        KEY,
        task,
        call_id=request.call_id,
        tool=request.tool,
        reply_to=request.reply_to,
        deadline=request.deadline,
        run_id=request.run_id,
        idempotency_key=request.idempotency_key,
        arguments_json=json.dumps(request.arguments, separators=(",", ":")).encode(),
        headers=headers_of(call),
    )


def test_a_short_signing_key_is_refused_without_showing_it() -> None:
    with pytest.raises(
        ConfigurationError, match="TOOLEXEC_SIGNING_KEY: .*at least 16 characters"
    ) as refused:
        Settings.from_env({"TOOLEXEC_SIGNING_KEY": "short-secret"})

    assert "short-secret" not in str(refused.value)


def test_the_key_is_hidden_in_the_settings_repr() -> None:
    config = Settings.from_env({"TOOLEXEC_SIGNING_KEY": KEY})

    assert KEY not in repr(config) and KEY not in str(config)
    assert config.signing_key is not None and config.signing_key.get_secret_value() == KEY


def test_a_redis_password_stays_out_of_the_settings_repr_and_errors() -> None:
    config = Settings.from_env(
        {"TOOLEXEC_BROKER_URL": "rediss://toolexec:pa%40ss@redis.internal:6380/0"}
    )

    assert "pa%40ss" not in repr(config) and "toolexec:***@redis.internal:6380" in repr(config)
    assert (
        config.broker_url == "rediss://toolexec:pa%40ss@redis.internal:6380/0"
    )  # the value itself is intact
    with pytest.raises(ConfigurationError) as refused:
        Settings.from_env({"TOOLEXEC_REDIS_URL": "http://toolexec:s3cret@redis.internal/0"})
    assert "s3cret" not in str(refused.value) and "toolexec:***@redis.internal" in str(
        refused.value
    )
