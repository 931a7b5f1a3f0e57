"""The worker's message path in this process, fed raw queue items: the poison harness.

:class:`MessagePath` assembles what a ``celery worker`` main process runs for every
message, minus the pool: toolexec's Celery app (``executor.seams.app.create_app``) on
the private Redis, its broker connection (toolexec's transport, ``executor.seams.transport``),
Celery's task consumer with toolexec's consumer (``executor.seams.consumer``) and the tasks'
strategy and request. :meth:`MessagePath.feed` pushes one raw item onto the queue and
drains one event, so the item goes through ``BRPOP``, the channel, kombu's message and
consumer, Celery's consumer, the strategy and the request. A message that becomes a
request is handed to :attr:`MessagePath.requests` instead of a pool.

Also here: strategies that build every kind of poison item from a well-formed envelope.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import redis
from celery import Celery
from celery.concurrency.solo import TaskPool
from celery.worker import state as worker_state
from celery.worker.request import Request
from hypothesis import strategies as st
from kombu.asynchronous.timer import Timer
from kombu.connection import Connection
from kombu.entity import Queue
from kombu.messaging import Consumer as KombuConsumer

from executor.seams.app import create_app
from executor.seams.consumer import Consumer
from executor.seams.transport import MAX_ITEM_OPTION
from wire import keys
from wire.message import redis_envelope, task_headers
from wire.models import TASK_AT_LEAST_ONCE, TASK_AT_MOST_ONCE, CallRequest
from wire.settings import Settings

__all__ = [
    "MARK",
    "Fed",
    "MessagePath",
    "dump",
    "encode_good_call",
    "envelope",
    "huge_items",
    "message_path",
    "poison_items",
    "sha256",
    "unknown_versions",
    "with_body",
]

#: Text put inside every poison item; a log record that contains it leaked a payload.
MARK = "p0is0n-" + uuid.uuid4().hex[:8]


@dataclass
class Fed:
    """What became of one item fed to the path."""

    #: Dead-letter entries the item added (newest first), decoded.
    dead_letters: list[dict[str, Any]]
    #: Requests the item became (handed over instead of run).
    requests: list[Request]
    #: Entries left in kombu's unacknowledged hash (ack emulation) after the item.
    unacked: int
    #: Items left on the queue after the item.
    queued: int


@dataclass
class MessagePath:
    """toolexec's worker main-process message path, in this process."""

    app: Celery
    connection: Connection
    client: redis.Redis
    queue: str
    settings: Settings
    requests: list[Request] = field(default_factory=list)

    def feed(self, item: bytes) -> Fed:
        """Push ``item`` on the queue, let the path take it, and report what became of it."""
        before = self._refusals()
        self.requests.clear()
        self.client.lpush(self.queue, item)
        self.connection.drain_events(timeout=5)  # type: ignore[no-untyped-call]
        added = self._refusals() - before
        entries = (
            [json.loads(e) for e in self.client.lrange(keys.DEADLETTER, 0, added - 1)]
            if added > 0
            else []
        )
        requests = list(self.requests)
        for request in requests:  # instead of running it: let go of the message
            request.reject(requeue=False)
        return Fed(
            dead_letters=entries,
            requests=requests,
            unacked=self.client.hlen("unacked"),
            queued=self.client.llen(self.queue),
        )

    @property
    def max_item_bytes(self) -> int:
        """The largest item the path reads (the transport's limit)."""
        return int(self.app.conf.broker_transport_options[MAX_ITEM_OPTION])

    def _refusals(self) -> int:
        return sum(int(n) for n in self.client.hvals(keys.DEADLETTER_COUNT))


@contextmanager
def message_path(
    redis_url: str, *, ack_emulation: bool, max_argument_bytes: int = 4096
) -> Iterator[MessagePath]:
    """The path on a fresh queue of the Redis at ``redis_url``; closed afterwards."""
    queue = f"poison-{uuid.uuid4().hex[:10]}"
    settings = Settings.from_env(
        {
            "TOOLEXEC_BROKER_URL": redis_url,
            "TOOLEXEC_REDIS_URL": redis_url,
            "TOOLEXEC_ACK_EMULATION": "true" if ack_emulation else "false",
            "TOOLEXEC_MAX_ARGUMENT_BYTES": str(max_argument_bytes),
        },
        tool_modules=(),
    )
    app = create_app(settings)
    requests: list[Request] = []
    consumer = Consumer(
        on_task_request=requests.append,
        app=app,
        hostname="poison@test",
        pool=TaskPool(),
        timer=Timer(),  # type: ignore[no-untyped-call]
        controller=SimpleNamespace(state=worker_state, use_eventloop=False),
    )
    consumer.event_dispatcher = None
    consumer.update_strategies()
    connection = app.connection_for_read()
    task_consumer: KombuConsumer = app.amqp.TaskConsumer(
        connection.default_channel,
        queues=[Queue(queue, routing_key=queue)],  # type: ignore[no-untyped-call]
        on_decode_error=consumer.on_decode_error,
    )
    task_consumer.on_message = consumer.create_task_handler()
    task_consumer.consume()  # type: ignore[no-untyped-call]
    with redis.Redis.from_url(redis_url) as client:
        try:
            client.delete("unacked", "unacked_index")
            yield MessagePath(app, connection, client, queue, settings, requests)
        finally:
            task_consumer.cancel()  # type: ignore[no-untyped-call]
            connection.release()
            client.delete(queue, "unacked", "unacked_index")


def envelope(
    queue: str, *, tool: str = "probe", task: str = TASK_AT_MOST_ONCE, **fields: Any
) -> dict[str, Any]:
    """A well-formed envelope of a call to ``tool`` (decoded: mutate it, then dump it)."""
    values: dict[str, Any] = {
        "call_id": f"call-{uuid.uuid4().hex[:12]}",
        "tool": tool,
        "reply_to": "nobody",
    }
    values.update(fields)
    call = CallRequest(**values)
    headers = task_headers(call, task_name=task, hard_limit=None)
    envelope_json: dict[str, Any] = json.loads(redis_envelope(call, queue=queue, headers=headers))
    return envelope_json


def dump(value: Any) -> bytes:
    """``value`` as the JSON bytes a client pushes."""
    return json.dumps(value, separators=(",", ":")).encode()


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def with_body(env: dict[str, Any], body: Any) -> bytes:
    """``env`` with ``body`` (any JSON value) as its protocol-2 body, dumped."""
    return dump({**env, "body": _b64(dump(body))})


def _body_of(value: Any) -> str:
    return _b64(dump(value))


def sha256(raw: bytes) -> str:
    """The hex digest a dead-letter entry names."""
    return hashlib.sha256(raw).hexdigest()


# -- strategies: every poison item, each built to be refused --------------------------

_json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
)
json_values = st.recursive(
    _json_scalars | st.just(MARK),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
#: JSON values that are not objects (strings, numbers, lists...).
not_objects = json_values.filter(lambda v: not isinstance(v, dict))
#: JSON values that are not strings.
not_strings = json_values.filter(lambda v: not isinstance(v, str))


@dataclass(frozen=True, repr=False)
class Mutation:
    """One change to a decoded envelope, named for hypothesis' failure reports."""

    name: str
    change: Callable[[dict[str, Any]], None]

    def __call__(self, env: dict[str, Any]) -> None:
        self.change(env)

    def __repr__(self) -> str:
        return self.name


def _set(path: tuple[str, ...], value: Any) -> Mutation:
    def mutate(env: dict[str, Any]) -> None:
        target = env
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return Mutation(f"set {'.'.join(path)} = {value!r}", mutate)


def _drop(path: tuple[str, ...]) -> Mutation:
    def mutate(env: dict[str, Any]) -> None:
        target = env
        for key in path[:-1]:
            target = target[key]
        target.pop(path[-1], None)

    return Mutation(f"drop {'.'.join(path)}", mutate)


def _headers(**values: Any) -> Mutation:
    def mutate(env: dict[str, Any]) -> None:
        env["headers"].update(values)

    return Mutation(f"headers {values!r}", mutate)


def _body(raw: bytes) -> Mutation:
    return Mutation(f"body = base64 of {raw!r}", _set(("body",), _b64(raw)).change)


def _fields(name: str, update: Callable[[dict[str, Any]], None]) -> Mutation:
    """Rewrite the call fields (the body's kwargs) with ``update``."""

    def mutate(env: dict[str, Any]) -> None:
        body = json.loads(base64.b64decode(env["body"]))
        update(body[1])
        env["body"] = _body_of(body)

    return Mutation(name, mutate)


def _field(name: str, value: Any) -> Mutation:
    return _fields(f"field {name} = {value!r}", lambda kwargs: kwargs.__setitem__(name, value))


def _without(name: str) -> Mutation:
    return _fields(f"no field {name}", lambda kwargs: kwargs.pop(name))


def _envelope_mutations() -> st.SearchStrategy[Mutation]:
    """One change, each enough to make a well-formed envelope unacceptable."""
    wrong_call_field = st.sampled_from(["call_id", "tool"]).flatmap(
        lambda name: not_strings.map(lambda v: _field(name, v))
    )
    return st.one_of(
        # kombu's envelope
        st.sampled_from(["properties", "body"]).map(lambda k: _drop((k,))),
        st.sampled_from(["delivery_tag", "delivery_info"]).map(lambda k: _drop(("properties", k))),
        not_objects.map(lambda v: _set(("properties",), v)),
        not_strings.filter(lambda v: v is not None).map(lambda v: _set(("body",), v)),
        not_strings.filter(lambda v: v is not None).map(
            lambda v: _set(("properties", "delivery_tag"), v)
        ),
        not_objects.filter(lambda v: v is not None).map(lambda v: _set(("headers",), v)),
        st.sampled_from(["gzip", "rot13", "zzz", MARK]).map(
            lambda v: _set(("properties", "body_encoding"), v)
        ),
        not_strings.filter(lambda v: v is not None).map(lambda v: _set(("content-type",), v)),
        st.text(alphabet="!@#$%^&*", min_size=1, max_size=12).map(
            lambda v: _set(("body",), v + MARK)
        ),
        # the body and its serializer
        st.binary(max_size=40).map(lambda b: _body(b"\xff\xfe" + b + MARK.encode())),
        st.sampled_from(
            ["application/x-python-serialize", "application/x-yaml", "application/x-msgpack"]
        ).map(lambda ct: _set(("content-type",), ct)),
        _json_scalars.map(lambda v: _body(dump(v))),
        st.lists(json_values, max_size=5)
        .filter(lambda v: len(v) != 3)
        .map(lambda v: _body(dump(v))),
        json_values.map(
            lambda v: _body(dump({"args": [], "kwargs": {"x": v}}))
        ),  # protocol 1 style
        # Celery's headers
        st.sampled_from([_drop(("headers", "task")), _drop(("headers", "id"))]),
        not_strings.map(lambda v: _headers(task=v)),
        st.just(_headers(task="celery.no_such_task")),
        not_strings.map(lambda v: _headers(id=v)),
        st.just(_headers(eta="2030-01-01T00:00:00+00:00")),
        st.sampled_from([MARK, 12, [1], {"a": MARK}]).map(lambda v: _headers(expires=v)),
        st.sampled_from([MARK, 12, [1], [1, 2, 3], [-1, None], ["x", None], [True, None]]).map(
            lambda v: _headers(timelimit=v)
        ),
        not_strings.filter(lambda v: v is not None).map(lambda v: _headers(shadow=v)),
        st.just(_headers(compression="application/x-gzip")),
        # protocol 2 body: [args, kwargs, embed]
        st.lists(json_values, min_size=1, max_size=3).map(lambda args: _body_slot(0, args)),
        not_objects.map(lambda v: _body_slot(1, v)),
        st.sampled_from(["callbacks", "errbacks", "chain", "chord"]).map(
            lambda k: _body_slot(2, {k: [{"task": "celery.ping", "args": [MARK]}]})
        ),
        json_values.map(lambda v: _body_slot(2, {"unknown": v or 1})),
        # toolexec's call fields
        wrong_call_field,
        st.sampled_from(["call_id", "tool"]).map(_without),
        not_objects.filter(lambda v: v is not None).map(lambda v: _field("arguments", v)),
        st.sampled_from([MARK, [1], {"a": 1}]).map(lambda v: _field("deadline", v)),
        st.sampled_from([[MARK], {"a": MARK}, 7]).map(lambda v: _field("reply_to", v)),
    )


def _body_slot(index: int, value: Any) -> Mutation:
    def mutate(env: dict[str, Any]) -> None:
        body = json.loads(base64.b64decode(env["body"]))
        body[index] = value
        env["body"] = _body_of(body)

    return Mutation(f"body[{index}] = {value!r}", mutate)


def poison_items(queue: str, *, max_item_bytes: int) -> st.SearchStrategy[bytes]:
    """Raw items a worker must refuse: every shape a body and its headers can take.

    ``max_item_bytes`` is the largest item the worker reads (its transport's limit):
    huge items are drawn around it, on both sides.
    """
    good = dump(envelope(queue))
    mutated = st.lists(_envelope_mutations(), min_size=1, max_size=3).map(
        lambda ms: _apply(queue, ms)
    )
    kinds = [
        st.binary(max_size=64).map(lambda b: b + MARK.encode()),  # anything at all
        st.binary(min_size=1, max_size=16).map(lambda b: b"\xff" + b + MARK.encode()),  # not UTF-8
        not_objects.map(lambda v: dump([v, MARK])),  # JSON, not an object
        st.integers(min_value=1, max_value=len(good) - 1).map(lambda n: good[:n]),  # truncated
        huge_items(queue, max_item_bytes=max_item_bytes),
        unknown_versions(queue),
        mutated,
        mutated,  # twice as likely: the envelope mutations are where the paths branch
    ]
    # One kind, then one item of it: one_of would flatten the kinds made of several
    # (huge items, unknown versions) into a branch each and draw them that much more often.
    return st.sampled_from(kinds).flatmap(lambda kind: kind)


def _padding(size: int) -> str:
    """``size`` characters of text that carry :data:`MARK` (cheap to build at any size)."""
    return (MARK * (size // len(MARK) + 1))[:size]


def huge_items(queue: str, *, max_item_bytes: int) -> st.SearchStrategy[bytes]:
    """Items within 8 KiB of the worker's limit, either side: too large, or large and malformed.

    Built from a drawn size, not drawn byte by byte, so a 70 KB example costs little more
    to make than a small one.
    """
    sizes = st.integers(min_value=max_item_bytes - 8_192, max_value=max_item_bytes - 1_024)
    over = st.integers(min_value=max_item_bytes + 1, max_value=max_item_bytes + 8_192)

    def with_padding(size: int, build: Callable[[str], bytes]) -> bytes:
        # The padding may be encoded on the way (base64 in the body): measure its cost.
        bare, sample = len(build("")), len(build(_padding(1_000)))
        return build(_padding(max(0, int((size - bare) * 1_000 / (sample - bare)))))

    good_call = functools.partial(_huge_call, queue)
    return st.one_of(
        # Over the limit: refused unread, whatever it holds (even a well-formed call).
        over.map(lambda n: _padding(n).encode()),
        over.map(lambda n: with_padding(n, good_call)),
        # Under the limit, read, and malformed in one of the ways a small item is.
        sizes.map(lambda n: with_padding(n, lambda pad: b"\xff" + pad.encode())),  # not UTF-8
        sizes.map(lambda n: with_padding(n, lambda pad: dump([pad]))),  # JSON, not an object
        sizes.map(lambda n: with_padding(n, good_call)[: n // 2]),  # truncated
        sizes.map(
            lambda n: with_padding(
                n, lambda pad: _huge_call(queue, pad, task="celery.no_such_task")
            )
        ),
        sizes.map(lambda n: with_padding(n, lambda pad: _huge_call(queue, pad, listed=True))),
        sizes.map(
            lambda n: with_padding(n, lambda pad: dump({**envelope(queue), "headers": [pad]}))
        ),
    )


def _huge_call(
    queue: str, pad: str, *, task: str = TASK_AT_LEAST_ONCE, listed: bool = False
) -> bytes:
    """A call to ``probe`` of task ``task`` whose arguments carry ``pad`` (in a list, not
    the object they must be, when ``listed``)."""
    env = envelope(queue, task=task, arguments={"secret": pad})
    if listed:
        _field("arguments", [pad])(env)
    return dump(env)


def unknown_versions(queue: str) -> st.SearchStrategy[bytes]:
    """Task messages of a version the worker does not speak: Celery's protocol 1, a
    body shaped as a later protocol might be, a task of a later toolexec."""
    call_fields = {
        "call_id": f"call-{uuid.uuid4().hex[:12]}",
        "tool": "probe",
        "arguments": {"secret": MARK},
    }

    def protocol_1(task: str) -> bytes:
        # Celery's protocol 1: no task header; the task, id and arguments in the body.
        env = envelope(queue, task=task)
        env["headers"] = {}
        body = {
            "task": task,
            "id": call_fields["call_id"],
            "args": [],
            "kwargs": call_fields,
            "retries": 0,
            "eta": None,
            "expires": None,
            "utc": True,
            "callbacks": None,
            "errbacks": None,
        }
        return with_body(env, body)

    def later_body(extra: Any) -> bytes:
        # [args, kwargs, embed] with one more element, as a protocol 3 might send.
        return with_body(envelope(queue, task=TASK_AT_LEAST_ONCE), [[], call_fields, None, extra])

    def later_task(task: str) -> bytes:
        return dump(envelope(queue, task=task, arguments={"secret": MARK}))

    return st.one_of(
        st.sampled_from([TASK_AT_MOST_ONCE, TASK_AT_LEAST_ONCE]).map(protocol_1),
        json_values.map(later_body),
        st.sampled_from(
            [
                f"{TASK_AT_MOST_ONCE}.v2",
                f"{TASK_AT_LEAST_ONCE}_v3",
                "toolexec.run_tool@2",
                "toolexec.call",
            ]
        ).map(later_task),
    )


def _apply(queue: str, mutations: list[Mutation]) -> bytes:
    env = envelope(queue, task=TASK_AT_LEAST_ONCE, arguments={"secret": MARK})
    applied = 0
    for mutate in mutations:
        try:
            mutate(env)
        except (AttributeError, KeyError, TypeError, ValueError, IndexError):
            continue  # an earlier change removed the spot this one changes
        applied += 1
    assert applied, "the first change always applies to a fresh envelope"
    return dump(env)


def encode_good_call(queue: str, **fields: Any) -> bytes:
    """A well-formed item: a call the path accepts."""
    return dump(envelope(queue, **fields))
