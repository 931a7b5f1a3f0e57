"""The client's message on the queue's list is the one ``app.send_task`` writes.

The client builds Celery's protocol 2 message and kombu's Redis envelope itself
(``wire.message``). Here the client's message for a call and stock ``send_task``'s
message for the same call go onto two queues of one private Redis, are popped raw and
compared field for field: the same keys at every level, the same values, ids and
times aside. A field a new kombu or Celery adds, drops or changes fails these tests.
"""

from __future__ import annotations

import base64
import json
import os
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest
import redis
from celery import Celery

from agent_client.prepare import PreparedCall, prepare_call
from agent_client.validation import ArgumentValidator
from wire.clock import shared_now
from wire.message import CELERY_EXPIRY_GRACE, CELERY_LIMIT_MARGIN
from wire.models import ToolSpec, task_name_for
from wire.settings import Settings

from .support import Check, differences, kwargsrepr_of, send_like_the_client

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string"},
        "limit": {"type": "integer"},
        "tags": {"type": "array"},
    },
    "required": ["query"],
}


@dataclass(frozen=True)
class Case:
    """One kind of call: the tool's spec (its queue is set per test) and the call."""

    spec: ToolSpec
    arguments: dict[str, Any]
    timeout: float | None
    run_id: str | None = None


CASES = {
    "deadline_and_hard_limit": Case(
        ToolSpec(name="search", description="d", parameters=SCHEMA, hard_timeout=10.0),
        {"query": "fox grapes", "limit": 3},
        timeout=30.0,
    ),
    "no_deadline_no_limit": Case(
        ToolSpec(name="search", description="d", parameters=SCHEMA),
        {"query": "fox"},
        timeout=None,
    ),
    "at_least_once_idempotent": Case(
        ToolSpec(
            name="book_flight",
            description="d",
            parameters=SCHEMA,
            idempotent=True,
            delivery="at_least_once",
            hard_timeout=5.0,
        ),
        {"query": "LH-400", "tags": ["window", 2]},
        timeout=20.0,
        run_id="run-contract",
    ),
    "non_ascii_arguments": Case(
        ToolSpec(name="recherche", description="d", parameters=SCHEMA, delivery="at_least_once"),
        {"query": 'Zoë — 東京 🦊 "quoted" \\ back\u2028slash', "tags": ["ñ", "\u00e9t\u00e9"]},
        timeout=15.0,
    ),
}


def decoded(raw: bytes) -> dict[str, Any]:
    """A raw queue entry as JSON, with its body decoded as its content headers say."""
    envelope: dict[str, Any] = json.loads(raw)
    assert envelope["properties"]["body_encoding"] == "base64"
    assert envelope["content-type"] == "application/json"
    body = base64.b64decode(envelope["body"]).decode(envelope["content-encoding"])
    return {**envelope, "body": json.loads(body)}


def nonempty_strings(client: Any, stock: Any) -> str | None:
    """An id: each side makes its own, both must be non-empty strings."""
    ok = all(isinstance(value, str) and value for value in (client, stock))
    return None if ok else f"not both non-empty strings: client {client!r}, send_task {stock!r}"


def same_instant(client: Any, stock: Any) -> str | None:
    """``expires``: both null, or ISO 8601 times within a millisecond of each other."""
    if client is None and stock is None:
        return None
    if not (isinstance(client, str) and isinstance(stock, str)):
        return f"client {client!r}, send_task {stock!r}"
    apart = abs((datetime.fromisoformat(client) - datetime.fromisoformat(stock)).total_seconds())
    return None if apart <= 0.001 else f"client {client} and send_task {stock} are {apart}s apart"


def routed_to(queue_a: str, queue_b: str) -> Check:
    """The routing key: each message names the queue it was written for."""

    def check(client: Any, stock: Any) -> str | None:
        ok = client == queue_a and stock == queue_b
        return (
            None
            if ok
            else f"client {client!r} (queue {queue_a}), send_task {stock!r} (queue {queue_b})"
        )

    return check


def remaining_ms(deadline: float, built_from: float, built_until: float) -> Check:
    """``expiration``: each side's milliseconds left to the deadline while it built the message."""
    low, high = int((deadline - built_until) * 1000) - 1, int((deadline - built_from) * 1000) + 1

    def check(client: Any, stock: Any) -> str | None:
        for side, value in (("client", client), ("send_task", stock)):
            if not (isinstance(value, str) and value.isdigit()):
                return f"{side} wrote {value!r}, not milliseconds as a string"
        if not (low <= int(client) <= high and low <= int(stock) <= high):
            return f"client {client}, send_task {stock}: not both within [{low}, {high}] ms"
        return None

    return check


def prepare(case: Case, *, queue: str, settings: Settings) -> PreparedCall:
    """The call as the client prepares it, for ``case``'s tool on ``queue``."""
    spec = case.spec.model_copy(update={"queue": queue})
    return prepare_call(
        spec,
        case.arguments,
        validator=ArgumentValidator(
            spec.name, spec.parameters, max_bytes=settings.max_argument_bytes
        ),
        settings=settings,
        call_id=uuid.uuid4().hex,
        reply_to=f"contract-client-{uuid.uuid4().hex[:8]}",
        timeout=case.timeout,
        run_id=case.run_id,
        idempotency_key=None,
        origin=f"toolexec-client@{os.getpid()}",
    )


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_client_writes_the_message_send_task_writes_ids_and_times_aside(
    case: Case, redis_client: redis.Redis, producer: Celery, contract_settings: Settings
) -> None:
    queue_a, queue_b = f"contract-client-{uuid.uuid4().hex}", f"contract-stock-{uuid.uuid4().hex}"
    # The client measures the expiration on the shared clock (Redis' TIME, as the
    # deadline), send_task on this host's: the window spans both while each side built.
    client_from = shared_now()
    call = prepare(case, queue=queue_a, settings=contract_settings)
    client_until = shared_now()
    redis_client.lpush(queue_a, call.envelope)
    hard = case.spec.hard_timeout + CELERY_LIMIT_MARGIN if case.spec.hard_timeout else None
    task_name = task_name_for(case.spec.delivery)
    stock_from = time.time()
    send_like_the_client(
        producer, call.request, task_name=task_name, queue=queue_b, hard_limit=hard
    )
    stock_until = time.time()

    raw_client, raw_stock = redis_client.rpop(queue_a), redis_client.rpop(queue_b)
    assert raw_client is not None and raw_stock is not None, "a message is missing from its queue"
    assert redis_client.llen(queue_a) == redis_client.llen(queue_b) == 0
    client, stock = decoded(raw_client), decoded(raw_stock)

    allowed: dict[str, Check] = {
        "headers.origin": nonempty_strings,
        "headers.expires": same_instant,
        "properties.reply_to": nonempty_strings,
        "properties.delivery_tag": nonempty_strings,
        "properties.delivery_info.routing_key": routed_to(queue_a, queue_b),
    }
    if call.request.deadline is not None:
        deadline = call.request.deadline + CELERY_EXPIRY_GRACE
        window = remaining_ms(
            deadline, min(client_from, stock_from), max(client_until, stock_until)
        )
        allowed["properties.expiration"] = window
    problems = differences(client, stock, allowed)
    assert not problems, "the client's message differs from send_task's:\n" + "\n".join(problems)

    # What both must say, so the comparison above is not two equal mistakes.
    headers = client["headers"]
    assert (headers["task"], headers["id"], headers["root_id"]) == (
        task_name,
        call.call_id,
        call.call_id,
    )
    assert headers["timelimit"] == [hard, None]
    assert (headers["argsrepr"], headers["kwargsrepr"]) == ("()", kwargsrepr_of(case.spec.name))
    args, kwargs, _embed = client["body"]
    assert args == [] and kwargs == call.request.model_dump(mode="json")
    assert kwargs["arguments"] == case.arguments
    if case.timeout is None:
        assert headers["expires"] is None and "expiration" not in client["properties"]
    else:
        assert "expiration" in client["properties"]
    # Tool arguments travel in the body only, never in the reprs, headers or properties.
    outside_body = json.dumps([client["headers"], client["properties"]], ensure_ascii=False)
    assert case.arguments["query"] not in outside_body


def test_the_comparison_fails_on_a_field_only_one_side_writes(
    redis_client: redis.Redis, producer: Celery, contract_settings: Settings
) -> None:
    case = CASES["deadline_and_hard_limit"]
    queue = f"contract-self-check-{uuid.uuid4().hex}"
    call = prepare(case, queue=queue, settings=contract_settings)
    client = decoded(call.envelope.encode())
    newer = {**client, "headers": {**client["headers"], "new_in_celery": None}}
    changed = {**client, "properties": {**client["properties"], "priority": 9}}

    assert differences(client, client, {}) == []
    assert differences(client, newer, {}) == [
        "headers: keys only the client writes [], keys only send_task writes ['new_in_celery']"
    ]
    assert differences(client, changed, {}) == ["properties.priority: client 0 != send_task 9"]
