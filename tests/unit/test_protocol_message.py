"""wire.models and wire.message: the wire data and the Celery message built without Celery."""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime
from typing import Any

import pydantic
import pytest
from celery import Celery
from kombu.connection import Connection

from wire.message import CELERY_EXPIRY_GRACE, redis_envelope, task_headers
from wire.models import (
    TASK_AT_LEAST_ONCE,
    TASK_AT_MOST_ONCE,
    CallOutcome,
    CallRequest,
    ErrorInfo,
    ErrorKind,
    ToolSpec,
    task_name_for,
)

SECRET = "card-4111-1111-1111-1111"


def a_call(deadline: float | None = 1_900_000_000.25) -> CallRequest:
    return CallRequest(
        call_id="3f2a9c",
        tool="book_flight",
        arguments={"card": SECRET, "seats": [1, 2]},
        reply_to="client-7",
        deadline=deadline,
        run_id="run-1",
        idempotency_key="key-1",
    )


def envelope_of(
    call: CallRequest, *, queue: str = "flights", hard_limit: float | None = 11.0
) -> dict[str, Any]:
    headers = task_headers(
        call, task_name=TASK_AT_MOST_ONCE, hard_limit=hard_limit, origin="client@host"
    )
    return json.loads(redis_envelope(call, queue=queue, headers=headers))  # type: ignore[no-any-return]


def body_of(envelope: dict[str, Any]) -> Any:
    return json.loads(base64.b64decode(envelope["body"]))


# -- the envelope kombu's Redis transport stores ---------------------------------------------


def test_the_body_is_celery_protocol_2_args_kwargs_embed_as_base64_json() -> None:
    call = a_call()
    envelope = envelope_of(call)

    args, kwargs, embed = body_of(envelope)

    assert args == []
    assert kwargs == call.model_dump(mode="json")
    assert embed == {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    assert CallRequest.model_validate(kwargs) == call
    assert (envelope["content-type"], envelope["content-encoding"]) == ("application/json", "utf-8")


def test_the_envelope_carries_kombus_properties() -> None:
    properties = envelope_of(a_call(), queue="flights")["properties"]

    assert properties["correlation_id"] == "3f2a9c"
    assert properties["reply_to"] == "client-7"
    assert properties["delivery_info"] == {"exchange": "", "routing_key": "flights"}
    assert (properties["body_encoding"], properties["delivery_mode"], properties["priority"]) == (
        "base64",
        2,
        0,
    )


def test_the_delivery_tag_is_the_call_id_so_a_resent_message_replaces_its_lost_copy() -> None:
    # Kombu keys its unacked record by the tag: when the watchdog re-sends a call whose
    # worker died, the live worker's ack also clears the dead worker's record, so the
    # lost copy is not restored (and run again) after the visibility timeout.
    call = a_call()

    assert envelope_of(call)["properties"]["delivery_tag"] == call.call_id


def test_kombu_decodes_the_envelope_into_the_task_message() -> None:
    call = a_call()
    raw = envelope_of(call, queue="flights")

    with Connection("memory://") as connection:  # type: ignore[no-untyped-call]
        channel = connection.channel()
        try:
            message = channel.Message(raw, channel=channel)
            decoded = message.decode()
        finally:
            channel.close()

    assert decoded == [
        [],
        call.model_dump(mode="json"),
        {"callbacks": None, "errbacks": None, "chain": None, "chord": None},
    ]
    assert message.headers["task"] == TASK_AT_MOST_ONCE
    assert message.headers["id"] == call.call_id
    assert message.delivery_info["routing_key"] == "flights"
    assert message.content_type == "application/json"


def test_the_headers_use_only_keys_celery_itself_writes() -> None:
    app = Celery("header-reference", set_as_current=False)
    reference = app.amqp.as_task_v2(
        "id", TASK_AT_MOST_ONCE, args=(), kwargs={}, expires=5, time_limit=3
    )

    ours = task_headers(a_call(), task_name=TASK_AT_MOST_ONCE, hard_limit=3.0)

    assert set(ours) <= set(reference.headers)
    assert {
        "lang",
        "task",
        "id",
        "root_id",
        "expires",
        "timelimit",
        "argsrepr",
        "kwargsrepr",
    } <= set(ours)


# -- headers ---------------------------------------------------------------------------


def test_headers_name_the_task_and_the_call() -> None:
    headers = task_headers(a_call(), task_name=TASK_AT_LEAST_ONCE, origin="client@host")

    assert (headers["lang"], headers["task"], headers["id"], headers["root_id"]) == (
        "py",
        TASK_AT_LEAST_ONCE,
        "3f2a9c",
        "3f2a9c",
    )
    assert (headers["parent_id"], headers["eta"], headers["retries"], headers["origin"]) == (
        None,
        None,
        0,
        "client@host",
    )


def test_expires_is_the_deadline_plus_the_grace_for_worker_clocks_as_an_aware_iso_timestamp() -> (
    None
):
    deadline = time.time() + 12.5

    expires = datetime.fromisoformat(
        task_headers(a_call(deadline), task_name=TASK_AT_MOST_ONCE)["expires"]
    )

    assert expires.tzinfo is not None and expires.utcoffset() == UTC.utcoffset(None)
    assert expires.timestamp() == pytest.approx(deadline + CELERY_EXPIRY_GRACE, abs=1e-6)


def test_a_call_without_a_deadline_never_expires() -> None:
    assert task_headers(a_call(None), task_name=TASK_AT_MOST_ONCE)["expires"] is None


@pytest.mark.parametrize("hard_limit", [11.0, None])
def test_the_hard_limit_goes_first_in_timelimit_as_celery_orders_it(
    hard_limit: float | None,
) -> None:
    # Celery's own messages carry [time_limit, soft_time_limit].
    assert task_headers(a_call(), task_name=TASK_AT_MOST_ONCE, hard_limit=hard_limit)[
        "timelimit"
    ] == [hard_limit, None]


def test_no_argument_value_leaks_into_headers_or_properties() -> None:
    envelope = envelope_of(a_call())

    assert SECRET not in json.dumps(envelope["headers"])
    assert SECRET not in json.dumps(envelope["properties"])
    assert envelope["headers"]["argsrepr"] == "()"
    assert envelope["headers"]["kwargsrepr"] == "{'tool': 'book_flight'}"


def test_the_task_result_is_ignored_because_the_outcome_travels_on_its_own() -> None:
    assert task_headers(a_call(), task_name=TASK_AT_MOST_ONCE)["ignore_result"] is True


# -- protocol data -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delivery", "task"),
    [("at_most_once", TASK_AT_MOST_ONCE), ("at_least_once", TASK_AT_LEAST_ONCE)],
)
def test_each_delivery_mode_has_its_own_task(delivery: Any, task: str) -> None:
    assert task_name_for(delivery) == task


def test_success_and_failure_outcomes_round_trip_through_json() -> None:
    success = CallOutcome.success("c", {"n": [1, 2]}, worker="w")
    failure = CallOutcome.failure(
        "c", ErrorKind.HARD_TIMEOUT, "ToolHardTimeout", "stopped", worker="w"
    )

    assert CallOutcome.model_validate_json(success.model_dump_json()) == success
    assert CallOutcome.model_validate_json(failure.model_dump_json()) == failure
    assert json.loads(failure.model_dump_json())["error"] == {
        "kind": "hard_timeout",
        "type": "ToolHardTimeout",
        "message": "stopped",
        "attempts": 1,
    }


def test_an_outcome_can_be_readdressed_to_a_joining_call() -> None:
    outcome = CallOutcome.failure("first", ErrorKind.EXECUTION, "ValueError", "bad")

    joined = outcome.for_call("second")

    assert (joined.call_id, joined.error) == ("second", outcome.error)
    assert outcome.call_id == "first"


def test_error_kinds_are_plain_strings_on_the_wire() -> None:
    assert {kind.value for kind in ErrorKind} == {
        "execution",
        "invalid_arguments",
        "not_found",
        "expired",
        "hard_timeout",
        "worker_lost",
        "cancelled",
    }
    assert (
        ErrorInfo.model_validate({"kind": "worker_lost", "type": "WorkerLost", "message": "m"}).kind
        is ErrorKind.WORKER_LOST
    )


def test_wire_models_ignore_fields_from_a_newer_peer_and_are_frozen() -> None:
    spec = ToolSpec.model_validate(
        {"name": "t", "description": "d", "parameters": {}, "added_later": True}
    )

    assert spec.delivery == "at_most_once" and spec.queue == "default"
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        spec.name = "other"


def test_a_spec_round_trips_through_the_catalogs_json() -> None:
    spec = ToolSpec(
        name="t",
        description="d",
        parameters={"type": "object"},
        idempotent=True,
        timeout=2.5,
        hard_timeout=1.0,
        delivery="at_least_once",
        cache_errors=True,
        queue="slow",
    )

    assert ToolSpec.model_validate_json(spec.model_dump_json()) == spec
