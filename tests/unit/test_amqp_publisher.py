"""agent_client._io.amqp_lane and unsent claims (agent_client._io.send) without a
broker: messages, confirms, claims.

What RabbitMQ's answers mean for each call of a batch (``basic.ack`` / ``basic.nack``,
one message or every one up to a tag), the AMQP message read back from the call's
envelope, and which dropped sends free their claim.
"""

from __future__ import annotations

import collections
import concurrent.futures
import time
from datetime import datetime

from agent_client._io.amqp_lane import AmqpChannel, Published, amqp_message
from agent_client._io.callstate import CallState, Send
from agent_client._io.send import unsent_claims
from agent_client.prepare import PreparedCall
from wire.message import CELERY_EXPIRY_GRACE, message_body, redis_envelope, task_headers
from wire.models import TASK_AT_MOST_ONCE, CallRequest, ToolSpec

SECRET = "card-4111-1111-1111-1111"


def a_call(deadline: float | None) -> CallRequest:
    return CallRequest(
        call_id="c-1",
        tool="book_flight",
        arguments={"card": SECRET, "seats": [1, 2]},
        reply_to="client-7",
        deadline=deadline,
        run_id="run-1",
        idempotency_key="key-1",
    )


def channel_awaiting(count: int) -> tuple[AmqpChannel, list[Published | None]]:
    """A channel that published ``count`` messages (delivery tags 1..count) and awaits them."""
    channel = AmqpChannel("amqp://guest:guest@127.0.0.1:1//")
    fates: list[Published | None] = [None] * count
    channel._fates = fates
    channel._pending = collections.OrderedDict((tag, tag - 1) for tag in range(1, count + 1))
    return channel, fates


def test_a_multiple_ack_confirms_every_message_up_to_its_tag_and_no_further() -> None:
    channel, fates = channel_awaiting(5)

    channel._on_ack(3, True)

    assert fates == [Published("confirmed")] * 3 + [None, None]
    assert list(channel._pending) == [4, 5]


def test_a_single_ack_or_nack_settles_only_its_own_message() -> None:
    channel, fates = channel_awaiting(3)

    channel._on_nack(2, False)
    channel._on_ack(3, False)

    assert fates[0] is None
    assert fates[1] is not None and fates[1].fate == "nacked"
    assert fates[2] == Published("confirmed")
    assert list(channel._pending) == [1]


def test_unconfirmed_messages_count_as_maybe_queued_when_the_wait_ends() -> None:
    channel, fates = channel_awaiting(3)
    channel._on_ack(1, False)

    settled = channel._unconfirmed(fates, "RabbitMQ did not confirm the publish in time")

    assert [f.fate for f in settled] == ["confirmed", "unknown", "unknown"]
    assert settled[1].error == "RabbitMQ did not confirm the publish in time"


def test_the_amqp_message_is_the_calls_protocol_2_body_and_headers_with_the_time_left() -> None:
    call = a_call(deadline=time.time() + 30)
    headers = task_headers(call, task_name=TASK_AT_MOST_ONCE, hard_limit=11.0, origin="client@host")
    envelope = redis_envelope(call, queue="flights", headers=headers)

    message = amqp_message(envelope)

    assert message.queue == "flights"
    assert message.body == message_body(call, b'{"card":"card-4111-1111-1111-1111","seats":[1,2]}')
    assert message.headers == headers
    assert (message.correlation_id, message.reply_to) == ("c-1", "client-7")
    assert call.deadline is not None
    assert message.expires_at == datetime.fromisoformat(headers["expires"]).timestamp()
    left = message.expiration()
    assert (
        left is not None and 30 + CELERY_EXPIRY_GRACE - 5 < left <= 30 + CELERY_EXPIRY_GRACE + 0.1
    )  # the shared clock
    # Tool arguments travel in the body only.
    assert SECRET not in str(message.headers)


def test_a_call_without_a_deadline_has_no_expiration() -> None:
    call = a_call(deadline=None)
    headers = task_headers(call, task_name=TASK_AT_MOST_ONCE, origin="client@host")

    message = amqp_message(redis_envelope(call, queue="flights", headers=headers))

    assert message.expires_at is None and message.expiration() is None


def a_send(*, idempotent: bool, push_only: bool) -> Send:
    call = a_call(deadline=None)
    if not idempotent:
        call = call.model_copy(update={"idempotency_key": None})
    spec = ToolSpec(
        name="book_flight", description="d", parameters={"type": "object"}, idempotent=idempotent
    )
    prepared = PreparedCall(
        spec=spec,
        request=call,
        envelope="{}",
        claim_ttl_ms=1000 if idempotent else None,
        sent_ttl_ms=1000,
    )
    state = CallState(
        tool=spec.name, delivery=spec.delivery, queue=spec.queue, envelope="{}", running_keys=()
    )
    return Send(call=prepared, future=concurrent.futures.Future(), state=state, push_only=push_only)


def test_only_a_claimed_call_of_which_nothing_was_published_frees_its_claim() -> None:
    never_published = a_send(idempotent=True, push_only=True)
    maybe_published = a_send(idempotent=True, push_only=True)
    maybe_published.state.take()  # a write of it may have reached the broker
    confirmed = a_send(idempotent=True, push_only=True)
    confirmed.state.confirm()
    not_claimed_yet = a_send(idempotent=True, push_only=False)
    plain = a_send(idempotent=False, push_only=True)

    released = unsent_claims([never_published, maybe_published, confirmed, not_claimed_yet, plain])

    assert released == [never_published]
