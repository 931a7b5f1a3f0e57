"""A signed call's message is ``send_task``'s with one more header, ``toolexec_signature``.

With ``TOOLEXEC_SIGNING_KEY`` set, the client adds the signature as a task message
header. Stock Celery writes the same message when the header is passed to
``send_task(headers=...)``: compared here field for field like the unsigned messages in
``test_envelope.py``, with no allowance for the new header (it must be equal on both
sides), so a signed call stays a message any Celery tool reads.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime

import redis
from celery import Celery

from wire.message import CELERY_LIMIT_MARGIN
from wire.models import task_name_for
from wire.settings import Settings
from wire.signing import SIGNATURE_HEADER, verify

from .support import Check, differences, send_like_the_client
from .test_envelope import (
    CASES,
    decoded,
    nonempty_strings,
    prepare,
    remaining_ms,
    routed_to,
    same_instant,
)

KEY = "contract-" + uuid.uuid4().hex


def test_a_signed_calls_message_is_send_tasks_with_the_signature_header(
    redis_client: redis.Redis, producer: Celery, contract_settings: Settings
) -> None:
    case = CASES["at_least_once_idempotent"]
    settings = contract_settings.model_copy(
        update={"signing_key": Settings.from_env({"TOOLEXEC_SIGNING_KEY": KEY}).signing_key}
    )
    queue_a, queue_b = f"contract-signed-{uuid.uuid4().hex}", f"contract-stock-{uuid.uuid4().hex}"
    started = time.time()
    call = prepare(case, queue=queue_a, settings=settings)
    signature = decoded(call.envelope.encode())["headers"][SIGNATURE_HEADER]
    redis_client.lpush(queue_a, call.envelope)
    hard = case.spec.hard_timeout + CELERY_LIMIT_MARGIN if case.spec.hard_timeout else None
    task_name = task_name_for(case.spec.delivery)
    send_like_the_client(
        producer,
        call.request,
        task_name=task_name,
        queue=queue_b,
        hard_limit=hard,
        headers={SIGNATURE_HEADER: signature},
    )
    ended = time.time()

    raw_client, raw_stock = redis_client.rpop(queue_a), redis_client.rpop(queue_b)
    assert raw_client is not None and raw_stock is not None
    client, stock = decoded(raw_client), decoded(raw_stock)
    allowed: dict[str, Check] = {
        "headers.origin": nonempty_strings,
        "headers.expires": same_instant,
        "properties.reply_to": nonempty_strings,
        "properties.delivery_tag": nonempty_strings,
        "properties.delivery_info.routing_key": routed_to(queue_a, queue_b),
    }
    # The milliseconds left to the instant the client's message says it expires.
    expires = datetime.fromisoformat(client["headers"]["expires"]).timestamp()
    allowed["properties.expiration"] = remaining_ms(expires, started, ended)
    problems = differences(client, stock, allowed)

    assert not problems, "the signed message differs from send_task's:\n" + "\n".join(problems)
    _args, kwargs, _embed = client["body"]
    signed, stock_headers = client["headers"], stock["headers"]
    assert verify(KEY, signed[SIGNATURE_HEADER], signed["task"], kwargs, headers=signed) is None
    assert (
        verify(
            KEY,
            stock_headers[SIGNATURE_HEADER],
            stock_headers["task"],
            stock["body"][1],
            headers=stock_headers,
        )
        is None
    )
