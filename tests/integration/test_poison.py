"""A real worker refuses every poison message, keeps its PID, and serves the next call.

Before toolexec refused them, one ``LPUSH 'garbage'`` stopped the worker's main process.
Here a real ``celery worker`` (prefork) takes one item of every poison shape from its
queue, then a good call: the worker's PID is the same, the good call succeeds, the
dead-letter list holds one entry per item (its SHA-256, size and queue), the counts
grew, nothing is left unacknowledged (with kombu's ack emulation off and on), and the
worker's log, at INFO, holds no payload text.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from agent_client import ToolClient, remote_tool
from toolexec import WorkerProcess
from wire import keys
from wire.message import redis_envelope, task_headers
from wire.models import TASK_AT_LEAST_ONCE, TASK_AT_MOST_ONCE, CallRequest

from .fault_support import FAULT_QUEUE, fault_env
from .polling import wait_until

pytestmark = pytest.mark.integration

PROJECT_ROOT = Path(__file__).resolve().parents[2]
#: Text inside every poison item: the worker's log must never contain it.
MARK = "p0is0n-" + uuid.uuid4().hex[:8]
#: The worker's TOOLEXEC_MAX_ARGUMENT_BYTES: an item over 2 x this + 64 KiB is refused unread.
MAX_ARGUMENT_BYTES = 4096


@pytest.fixture(
    params=[("prefork", "false"), ("prefork", "true"), ("asyncio", "false")],
    ids=["ack-emulation-off", "ack-emulation-on", "asyncio-loop-reads"],
)
def worker(
    request: pytest.FixtureRequest, settings_env: dict[str, str], tmp_path: Path
) -> Iterator[WorkerProcess]:
    """A worker of the fault tools at INFO: prefork with kombu's ack emulation off or on,
    and the asyncio pool, whose event loop reads the queue (executor.pools.reads)."""
    pool, ack_emulation = request.param
    env = fault_env(
        settings_env,
        TOOLEXEC_ACK_EMULATION=ack_emulation,
        TOOLEXEC_MAX_ARGUMENT_BYTES=str(MAX_ARGUMENT_BYTES),
    )
    process = WorkerProcess(
        name=f"poison-{uuid.uuid4().hex[:8]}",
        pool=pool,
        concurrency=2,
        queues=(FAULT_QUEUE,),
        env=env,
        cwd=PROJECT_ROOT,
        log_dir=tmp_path,
        loglevel="INFO",
    )
    with process:
        yield process


def envelope(task: str = TASK_AT_MOST_ONCE, **fields: Any) -> dict[str, Any]:
    """A well-formed envelope of a call to ``fault_echo``, decoded, to spoil."""
    values: dict[str, Any] = {
        "call_id": f"call-{uuid.uuid4().hex[:12]}",
        "tool": "fault_echo",
        "reply_to": "nobody",
        "arguments": {"text": MARK},
    }
    values.update(fields)
    call = CallRequest(**values)
    text = redis_envelope(call, queue=FAULT_QUEUE, headers=task_headers(call, task_name=task))
    decoded: dict[str, Any] = json.loads(text)
    return decoded


def dump(value: Any) -> bytes:
    return json.dumps(value).encode()


def with_body(env: dict[str, Any], body: Any) -> bytes:
    return dump({**env, "body": base64.b64encode(dump(body)).decode()})


def poison_items() -> dict[str, bytes]:
    """One item of each shape that used to stop a worker, or could."""
    pickled = envelope()
    pickled["content-type"] = "application/x-python-serialize"
    no_task = envelope()
    del no_task["headers"]["task"]
    unknown_task = envelope()
    unknown_task["headers"]["task"] = "celery.no_such_task"
    bad_encoding = envelope()
    bad_encoding["properties"]["body_encoding"] = "rot13"
    late = envelope()
    late["headers"]["timelimit"] = [MARK, None]
    good_call = envelope(TASK_AT_LEAST_ONCE)
    return {
        "garbage": b"garbage " + MARK.encode(),
        "a JSON list": dump([1, 2, MARK]),
        "not UTF-8": b"\xff\xfe" + MARK.encode(),
        "truncated": dump(envelope())[:-7],
        "pickle": dump(pickled),
        "a body that is a number": with_body(envelope(), 5),
        "a body of the wrong arity": with_body(envelope(), [[], {"tool": MARK}]),
        "protocol 1": with_body(
            no_task, {"task": "toolexec.run_tool", "args": [], "kwargs": {"x": MARK}}
        ),
        "no task header": dump(no_task),
        "an unknown task": dump(unknown_task),
        "a body encoding nobody knows": dump(bad_encoding),
        "a time limit that is not a number": dump(late),
        "call fields of the wrong types": with_body(
            good_call, [[], {"call_id": 7, "tool": ["fault_echo"], "arguments": MARK}, None]
        ),
        "positional arguments": with_body(good_call, [[MARK], {"call_id": "c", "tool": "t"}, None]),
        "callbacks": with_body(
            good_call,
            [[], {"call_id": "c", "tool": "fault_echo"}, {"callbacks": [{"task": "celery.ping"}]}],
        ),
        "huge": b'{"body":"' + MARK.encode() * (3 * MAX_ARGUMENT_BYTES) + b'"}',
        # Within Python's JSON limits, past its pickling's: two of them once took both
        # slots of a prefork -c 2 worker for good (the main process failed to write them
        # to a child), so nothing ran after them.
        "arguments nested 500 deep": with_body(good_call, deep_call(500)),
        "arguments nested 900 deep": with_body(good_call, deep_call(900)),
        "arguments nested 101 deep": with_body(good_call, deep_call(101)),
        "a deadline of Infinity": with_body(
            good_call,
            [[], {"call_id": "c-inf", "tool": "fault_echo", "deadline": float("inf")}, None],
        ),
        "JSON null": b"null",
    }


def deep_call(levels: int) -> list[Any]:
    """The body of a ``fault_echo`` call whose argument nests ``levels`` arrays deep."""
    value: Any = MARK
    for _ in range(levels):
        value = [value]
    return [
        [],
        {"call_id": f"c-deep-{levels}", "tool": "fault_echo", "arguments": {"text": value}},
        None,
    ]


def refusals(client: redis.Redis) -> int:
    return sum(int(n) for n in client.hvals(keys.DEADLETTER_COUNT))


def test_every_poison_shape_is_refused_and_dead_lettered_and_the_same_worker_serves_the_next_call(
    worker: WorkerProcess, tool_client: ToolClient, redis_client: redis.Redis
) -> None:
    pid = worker.pid
    items = poison_items()
    before = refusals(redis_client)

    for item in items.values():
        redis_client.lpush(FAULT_QUEUE, item)
    result = remote_tool("fault_echo", timeout=20)(text="after the poison")

    assert result["text"] == "after the poison"
    assert wait_until(lambda: refusals(redis_client) == before + len(items))
    assert worker.is_running and worker.pid == pid
    entries = [json.loads(e) for e in redis_client.lrange(keys.DEADLETTER, 0, len(items) - 1)]
    assert {e["sha256"] for e in entries} == {hashlib.sha256(i).hexdigest() for i in items.values()}
    assert {e["queue"] for e in entries} == {FAULT_QUEUE}
    by_hash = {hashlib.sha256(i).hexdigest(): i for i in items.values()}
    for entry in entries:
        assert entry["size"] == len(by_hash[entry["sha256"]])
    assert redis_client.llen(FAULT_QUEUE) == 0
    assert redis_client.hlen("unacked") == 0  # nothing left to be redelivered
    log = worker.log_path.read_text(errors="replace")
    assert "refused a message on queue 'faults'" in log
    assert MARK not in log
    assert "Traceback" not in log
