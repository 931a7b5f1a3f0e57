"""Signed calls: a worker with TOOLEXEC_SIGNING_KEY runs what a key holder signed, only that.

An unsigned call, one signed with another key, and a signed message altered on the way
(its arguments, its tool, Celery's hard limit or expiry in its headers) are refused
before the tool runs: the tool leaves no mark, the message is dead-lettered with its
reason, and the caller gets an error that says which key to set.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from agent_client import ToolClient, ToolExecutionError, remote_tool
from agent_client.prepare import PreparedCall, prepare_call
from agent_client.runs import run_scope
from agent_client.validation import ArgumentValidator
from tests.integration.conftest import PROJECT_ROOT
from tests.integration.polling import wait_until
from tests.worker.support import next_reply
from toolexec import WorkerProcess
from wire import keys
from wire.models import ToolSpec
from wire.settings import Settings

pytestmark = pytest.mark.integration

KEY = "signing-key-" + uuid.uuid4().hex
QUEUE = "security"


@pytest.fixture(scope="module")
def env(settings_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The session's settings with the security tools and a signing key."""
    return {
        **settings_env,
        "TOOLEXEC_TOOL_MODULES": "tasks,tests.integration.security_tools",
        "TOOLEXEC_DATA_DIR": str(tmp_path_factory.mktemp("signing-data")),
        "TOOLEXEC_SIGNING_KEY": KEY,
    }


@pytest.fixture(scope="module", params=["prefork", "asyncio"])
def worker(
    request: pytest.FixtureRequest, env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """A worker with the key, on the ``security`` queue: prefork, then toolexec's asyncio pool."""
    started = WorkerProcess(
        name=f"signing-{uuid.uuid4().hex[:8]}",
        pool=request.param,
        concurrency=2,
        queues=(QUEUE,),
        env=env,
        cwd=PROJECT_ROOT,
        log_dir=tmp_path_factory.mktemp("signing-worker"),
    )
    with started:
        yield started


def client_with_key(env: dict[str, str], key: str | None) -> ToolClient:
    """A client whose TOOLEXEC_SIGNING_KEY is ``key`` (None: not set)."""
    values = {name: value for name, value in env.items() if name != "TOOLEXEC_SIGNING_KEY"}
    if key is not None:
        values["TOOLEXEC_SIGNING_KEY"] = key
    return ToolClient(Settings.from_env(values))


@pytest.fixture(scope="module")
def signed(env: dict[str, str], worker: WorkerProcess) -> Iterator[ToolClient]:
    """A client holding the workers' key."""
    client = client_with_key(env, KEY)
    yield client
    client.close()


def mark(env: dict[str, str], tag: str) -> Path:
    """Where the ``record`` tool leaves its mark for ``tag``."""
    return Path(env["TOOLEXEC_DATA_DIR"]) / f"ran-{tag}"


def dead_letters(redis_client: redis.Redis, tag: str) -> list[dict[str, Any]]:
    """The dead-letter entries of calls whose arguments hold ``tag``, payload decoded."""
    found = []
    for raw in redis_client.lrange(keys.DEADLETTER, 0, -1):
        entry = json.loads(raw)
        payload = base64.b64decode(entry["payload_b64"]).decode(errors="replace")
        if tag in payload:
            found.append({**entry, "payload": json.loads(payload)})
    return found


def test_a_signed_call_runs(signed: ToolClient, env: dict[str, str]) -> None:
    tag = uuid.uuid4().hex

    path = remote_tool("record", client=signed).invoke_sync({"tag": tag})

    assert Path(path) == mark(env, tag) and mark(env, tag).read_text() == "ran\n"


def test_a_signed_idempotent_at_least_once_call_runs_once_per_run(
    signed: ToolClient, env: dict[str, str]
) -> None:
    tag = uuid.uuid4().hex
    with run_scope():
        first = remote_tool("idem_record", client=signed).invoke_sync({"tag": tag})
        again = remote_tool("idem_record", client=signed).invoke_sync({"tag": tag})

    assert first == again and mark(env, tag).read_text() == "ran\n"


@pytest.mark.parametrize(
    ("key", "refusal", "advice"),
    [
        (None, "UnsignedCall", "set TOOLEXEC_SIGNING_KEY on the client"),
        ("another-key-" + uuid.uuid4().hex, "SignatureMismatch", "TOOLEXEC_SIGNING_KEY differs"),
    ],
    ids=["unsigned", "another key"],
)
def test_a_call_without_the_workers_key_is_refused_dead_lettered_and_the_caller_told(
    key: str | None,
    refusal: str,
    advice: str,
    worker: WorkerProcess,
    env: dict[str, str],
    redis_client: redis.Redis,
) -> None:
    tag = uuid.uuid4().hex
    client = client_with_key(env, key)
    try:
        with pytest.raises(ToolExecutionError) as refused:
            remote_tool("record", client=client).invoke_sync({"tag": tag}, timeout=20)
    finally:
        client.close()

    assert refused.value.remote_type == refusal
    assert advice in str(refused.value)
    assert not mark(env, tag).exists()
    entries = dead_letters(redis_client, tag)
    assert [e["reason"] for e in entries] == ["unsigned" if key is None else "signature_mismatch"]
    assert entries[0]["payload"]["kwargs"]["arguments"] == {"tag": tag}
    assert entries[0]["payload"]["task"] == "toolexec.run_tool"


def prepared_signed(env: dict[str, str], spec: ToolSpec, arguments: dict[str, Any]) -> PreparedCall:
    """A call signed with the workers' key, as the client writes it."""
    settings = Settings.from_env(env)
    validator = ArgumentValidator(spec.name, spec.parameters, max_bytes=settings.max_argument_bytes)
    return prepare_call(
        spec,
        arguments,
        validator=validator,
        settings=settings,
        call_id=uuid.uuid4().hex,
        reply_to=f"signing-{uuid.uuid4().hex[:8]}",
        timeout=30.0,
        run_id=None,
        idempotency_key=None,
        origin="test",
    )


SCHEMA = {"type": "object", "properties": {"tag": {"type": "string"}}, "required": ["tag"]}


@pytest.mark.parametrize("alteration", ["arguments", "tool", "timelimit", "expires"])
def test_a_signed_message_altered_on_the_way_is_refused(
    alteration: str, worker: WorkerProcess, env: dict[str, str], redis_client: redis.Redis
) -> None:
    original, altered = uuid.uuid4().hex, uuid.uuid4().hex
    tool = "echo" if alteration == "tool" else "record"
    spec = ToolSpec(name=tool, description="d", parameters=SCHEMA, queue=QUEUE, hard_timeout=5.0)
    call = prepared_signed(env, spec, {"tag": original})
    envelope = json.loads(call.envelope)
    args, kwargs, embed = json.loads(base64.b64decode(envelope["body"]))
    if alteration == "arguments":
        kwargs["arguments"] = {"tag": altered}
    elif alteration == "tool":  # the same arguments, to a tool with side effects
        kwargs["tool"] = "record"
        kwargs["arguments"] = {"tag": altered}
    elif (
        alteration == "timelimit"
    ):  # Celery's hard limit, its backstop for a stuck process, removed
        assert envelope["headers"]["timelimit"] == [6.0, None]
        envelope["headers"]["timelimit"] = [None, None]
    else:  # Celery's expiry moved a day later
        envelope["headers"]["expires"] = (
            datetime.fromisoformat(envelope["headers"]["expires"]) + timedelta(days=1)
        ).isoformat()
    envelope["body"] = base64.b64encode(json.dumps([args, kwargs, embed]).encode()).decode()
    redis_client.lpush(QUEUE, json.dumps(envelope))

    call_id, outcome = next_reply(redis_client, call.request.reply_to, timeout=20)

    assert call_id == call.call_id
    assert outcome.error is not None and outcome.error.type == "SignatureMismatch"
    assert not mark(env, altered).exists() and not mark(env, original).exists()
    sent = altered if alteration in ("arguments", "tool") else original
    entries = dead_letters(redis_client, sent)
    assert [(e["reason"], e["call_id"]) for e in entries] == [("signature_mismatch", call.call_id)]


def test_the_unaltered_message_of_that_kind_runs(
    worker: WorkerProcess, env: dict[str, str], redis_client: redis.Redis
) -> None:
    """The control of the test above: the same path, nothing altered."""
    tag = uuid.uuid4().hex
    spec = ToolSpec(name="record", description="d", parameters=SCHEMA, queue=QUEUE)
    call = prepared_signed(env, spec, {"tag": tag})
    envelope = json.loads(call.envelope)
    args, kwargs, embed = json.loads(base64.b64decode(envelope["body"]))
    envelope["body"] = base64.b64encode(json.dumps([args, kwargs, embed]).encode()).decode()
    redis_client.lpush(QUEUE, json.dumps(envelope))

    _call_id, outcome = next_reply(redis_client, call.request.reply_to, timeout=20)

    assert outcome.ok, outcome
    assert wait_until(mark(env, tag).exists, timeout=5)
