"""Every malformed item is refused on the worker's own message path, which keeps serving.

Each example pushes one raw item onto a queue of the private Redis and lets toolexec's
worker main-process path take it (``tests/worker/poison.py``: ``BRPOP``, toolexec's
transport, kombu's message and consumer, toolexec's Celery consumer, the tasks' strategy
and request), with kombu's ack emulation off and on. Whatever the item, nothing
escapes the path, the item is dead-lettered once (its SHA-256, size and queue),
acknowledged (nothing is left unacknowledged to be redelivered), nothing runs, and no
log record carries its text; a well-formed call right after it is still accepted.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executor.seams.deadletter import Refusal
from toolexec import RedisServer
from wire import keys
from wire.keys import DEADLETTER_PAYLOAD_BYTES
from wire.models import TASK_AT_MOST_ONCE, CallRequest

from .poison import (
    MARK,
    Fed,
    MessagePath,
    dump,
    encode_good_call,
    envelope,
    message_path,
    poison_items,
    sha256,
    with_body,
)

REASONS = {r.value for r in Refusal}

# The queue name is fixed per path; the strategies need it before the fixture runs.
PROPERTY = settings(
    max_examples=250,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module", params=[False, True], ids=["ack-emulation-off", "ack-emulation-on"])
def path(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[MessagePath]:
    """The worker's message path on a fresh queue, with kombu's ack emulation off or on."""
    with message_path(redis_server.url, ack_emulation=request.param) as built:
        yield built


def assert_refused(fed: Fed, item: bytes, path: MessagePath) -> None:
    """``item`` was dead-lettered once, acknowledged, and became no request."""
    assert fed.requests == []
    assert len(fed.dead_letters) == 1, fed.dead_letters
    entry = fed.dead_letters[0]
    assert entry["reason"] in REASONS
    assert (entry["sha256"], entry["size"], entry["queue"]) == (sha256(item), len(item), path.queue)
    assert base64.b64decode(entry["payload_b64"]) == item[:DEADLETTER_PAYLOAD_BYTES]
    assert MARK not in entry["detail"]
    assert (fed.unacked, fed.queued) == (0, 0)


def assert_accepted(fed: Fed, path: MessagePath) -> None:
    """The item became one request for a well-formed call, and nothing was dead-lettered."""
    assert fed.dead_letters == []
    assert len(fed.requests) == 1
    CallRequest.model_validate(fed.requests[0].kwargs)
    assert (fed.unacked, fed.queued) == (0, 0)


def counts(client: redis.Redis) -> dict[str, int]:
    """The dead-letter counts, by reason."""
    raw: dict[bytes, bytes] = client.hgetall(keys.DEADLETTER_COUNT)  # type: ignore[assignment]
    return {reason.decode(): int(count) for reason, count in raw.items()}


@PROPERTY
@given(data=st.data())
def test_every_malformed_item_is_refused_dead_lettered_once_and_never_logged_and_the_path_serves_on(
    path: MessagePath, caplog: pytest.LogCaptureFixture, data: st.DataObject
) -> None:
    item = data.draw(poison_items(path.queue, max_item_bytes=path.max_item_bytes), label="item")
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        fed = path.feed(item)
        after = path.feed(encode_good_call(path.queue))

    assert_refused(fed, item, path)
    assert_accepted(after, path)
    assert MARK not in caplog.text
    assert not any(r.exc_info for r in caplog.records)


def test_each_kind_of_poison_is_counted_under_its_reason(
    path: MessagePath, client: redis.Redis
) -> None:
    queue = path.queue
    pickled = envelope(queue)
    pickled["content-type"] = "application/x-python-serialize"
    cases = {
        Refusal.NOT_JSON: b"garbage",
        Refusal.NOT_AN_ENVELOPE: b"[1,2]",
        Refusal.CONTENT_DISALLOWED: dump(pickled),
        Refusal.INVALID_CALL: with_body(envelope(queue), [[], {"tool": "probe"}, None]),
    }
    before = counts(client)

    for reason, item in cases.items():
        fed = path.feed(item)
        assert_refused(fed, item, path)
        assert fed.dead_letters[0]["reason"] == reason.value

    after = counts(client)
    for reason in cases:
        assert after[reason.value] == before.get(reason.value, 0) + 1
    assert 0 < client.ttl(keys.DEADLETTER) <= keys.DEADLETTER_TTL
    assert 0 < client.ttl(keys.DEADLETTER_COUNT) <= keys.DEADLETTER_TTL


@pytest.mark.parametrize("item", [b"null", b"true", b"42", b'"text"', b"[]", b" null "])
def test_an_item_of_one_json_value_that_is_no_envelope_is_dead_lettered_as_such(
    path: MessagePath, item: bytes
) -> None:
    fed = path.feed(item)

    assert_refused(fed, item, path)
    assert fed.dead_letters[0]["reason"] == Refusal.NOT_AN_ENVELOPE.value


def test_an_item_larger_than_any_call_a_client_can_send_is_refused_unread(
    path: MessagePath,
) -> None:
    limit = path.max_item_bytes
    assert limit == 2 * path.settings.max_argument_bytes + 65_536
    item = b'{"body":"' + MARK.encode() * (limit // len(MARK) + 1) + b'"}'

    fed = path.feed(item)

    assert_refused(fed, item, path)
    entry = fed.dead_letters[0]
    assert entry["reason"] == Refusal.TOO_LARGE.value
    assert entry["payload_truncated"] is True
    assert len(base64.b64decode(entry["payload_b64"])) == DEADLETTER_PAYLOAD_BYTES


def test_a_message_of_a_version_the_worker_does_not_speak_is_refused_as_such(
    path: MessagePath,
) -> None:
    queue = path.queue
    call = {"call_id": "call-v1", "tool": "probe", "arguments": {"secret": MARK}}
    protocol_1 = {**envelope(queue), "headers": {}}
    later_toolexec = envelope(queue, task=f"{TASK_AT_MOST_ONCE}.v2")
    cases = {
        # Celery's protocol 1: the task in the body, no task header.
        with_body(
            protocol_1, {"task": TASK_AT_MOST_ONCE, "id": "call-v1", "args": [], "kwargs": call}
        ): Refusal.NOT_A_TASK,
        # A body with a fourth element, as a later protocol might send.
        with_body(envelope(queue), [[], call, None, {"v": 3}]): Refusal.INVALID_CALL,
        # The task of a later toolexec.
        dump(later_toolexec): Refusal.UNKNOWN_TASK,
    }

    for item, reason in cases.items():
        fed = path.feed(item)
        assert_refused(fed, item, path)
        assert fed.dead_letters[0]["reason"] == reason.value, item


def test_a_well_formed_call_with_large_arguments_within_the_limit_is_accepted(
    path: MessagePath,
) -> None:
    text = "x" * (path.settings.max_argument_bytes - 20)

    fed = path.feed(encode_good_call(path.queue, arguments={"text": text}))

    assert_accepted(fed, path)
    assert fed.requests[0].kwargs["arguments"] == {"text": text}


def test_the_dead_letter_list_keeps_only_its_newest_entries(
    path: MessagePath, client: redis.Redis
) -> None:
    client.delete(keys.DEADLETTER)
    client.rpush(keys.DEADLETTER, *[f"old-{i}" for i in range(keys.DEADLETTER_MAX_ENTRIES)])

    fed = path.feed(b"garbage " + MARK.encode())

    assert len(fed.dead_letters) == 1
    assert client.llen(keys.DEADLETTER) == keys.DEADLETTER_MAX_ENTRIES
    assert client.lindex(keys.DEADLETTER, -1) == f"old-{keys.DEADLETTER_MAX_ENTRIES - 2}".encode()
    client.delete(keys.DEADLETTER)
