"""No tool data in logs, on a real worker at ``-l INFO`` and in the agent process.

A secret travels in arguments, in a result, in a tool's exception message, in a
SystemExit that ends the pool process, in a call refused as invalid, and in messages the
worker refuses (an unregistered task, a body it may not decode). The caller gets the
secret back where it should (the result, the error message); the worker's log, which
does show every call at INFO, never holds it, and neither do the agent's log records.
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from agent_client import RemoteToolError, ToolClient, ToolExecutionError, remote_tool
from agent_client.prepare import PreparedCall, prepare_call
from agent_client.validation import ArgumentValidator
from tests.integration.conftest import PROJECT_ROOT
from tests.worker.support import next_reply
from toolexec import WorkerProcess
from wire.models import ErrorKind, ToolSpec
from wire.settings import Settings

pytestmark = pytest.mark.integration

SECRET = "4111-1111-1111-" + uuid.uuid4().hex[:8]
QUEUE = "security"


@pytest.fixture(scope="module")
def env(settings_env: dict[str, str]) -> dict[str, str]:
    """The session's settings with the security tools."""
    return {**settings_env, "TOOLEXEC_TOOL_MODULES": "tasks,tests.integration.security_tools"}


@pytest.fixture(scope="module")
def worker(
    env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """A prefork worker logging at INFO, on the ``security`` queue."""
    started = WorkerProcess(
        name=f"logs-{uuid.uuid4().hex[:8]}",
        pool="prefork",
        concurrency=2,
        queues=(QUEUE,),
        env=env,
        cwd=PROJECT_ROOT,
        log_dir=tmp_path_factory.mktemp("logs-worker"),
        loglevel="INFO",
    )
    with started:
        yield started


@pytest.fixture(scope="module")
def client(env: dict[str, str], worker: WorkerProcess) -> Iterator[ToolClient]:
    """The agent's client."""
    tool_client = ToolClient(Settings.from_env(env))
    yield tool_client
    tool_client.close()


def raw_call(env: dict[str, str], tool: str, arguments: dict[str, Any]) -> PreparedCall:
    """A call of ``tool`` as the client writes it, skipping the client's own checks."""
    settings = Settings.from_env(env)
    spec = ToolSpec(name=tool, description="d", parameters={"type": "object"}, queue=QUEUE)
    validator = ArgumentValidator(tool, spec.parameters, max_bytes=settings.max_argument_bytes)
    return prepare_call(
        spec,
        arguments,
        validator=validator,
        settings=settings,
        call_id=uuid.uuid4().hex,
        reply_to=f"logs-{uuid.uuid4().hex[:8]}",
        timeout=30.0,
        run_id=None,
        idempotency_key=None,
        origin="test",
    )


def with_body(call: PreparedCall, body: bytes, **changes: Any) -> str:
    """``call``'s envelope with another body (and header or envelope fields)."""
    envelope = json.loads(call.envelope)
    envelope["body"] = base64.b64encode(body).decode()
    envelope["headers"].update(changes.pop("headers", {}))
    envelope.update(changes)
    return json.dumps(envelope)


def test_no_argument_result_or_error_message_reaches_a_log_at_info(
    worker: WorkerProcess,
    client: ToolClient,
    env: dict[str, str],
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)

    # What the caller should get back: the secret, in the result and in the error.
    assert remote_tool("echo", client=client).invoke_sync({"text": SECRET}) == {"echo": SECRET}
    with pytest.raises(ToolExecutionError) as failed:
        remote_tool("fail", client=client).invoke_sync({"text": SECRET})
    assert SECRET in str(failed.value)
    with pytest.raises(RemoteToolError):  # the pool process exits: the call is lost
        remote_tool("crash", client=client).invoke_sync({"text": SECRET}, timeout=20)

    # What the worker refuses or rejects, each with the secret inside.
    invalid = raw_call(env, "echo", {"text": "x", "extra": SECRET})
    unknown_tool = raw_call(env, "no_such_tool", {"text": SECRET})
    for call in (invalid, unknown_tool):
        redis_client.lpush(QUEUE, call.envelope)
        _call_id, outcome = next_reply(redis_client, call.request.reply_to, timeout=20)
        assert outcome.error is not None
        assert outcome.error.kind in (ErrorKind.INVALID_ARGUMENTS, ErrorKind.NOT_FOUND)
    foreign = raw_call(env, "echo", {"text": SECRET})
    redis_client.lpush(
        QUEUE,
        with_body(foreign, json.dumps([[SECRET], {}, {}]).encode(), headers={"task": "os.system"}),
    )
    undecodable = raw_call(env, "echo", {"text": "x"})  # the client refuses kombu's marker itself
    fields = {
        **undecodable.request.model_dump(mode="json"),
        "arguments": {"text": {"__type__": "nope", "__value__": SECRET}},
    }
    redis_client.lpush(QUEUE, with_body(undecodable, json.dumps([[], fields, {}]).encode()))
    pickled = raw_call(env, "echo", {"text": SECRET})
    redis_client.lpush(
        QUEUE,
        with_body(
            pickled,
            b"\x80\x04\x95" + SECRET.encode(),
            **{"content-type": "application/x-python-serialize"},
        ),
    )
    # A call behind them: once it is answered, the worker has dealt with all of them.
    assert remote_tool("echo", client=client).invoke_sync({"text": "done"}) == {"echo": "done"}

    log = worker.log_path.read_text()
    assert "Task echo[" in log and "] received" in log  # INFO records are there...
    assert SECRET not in log, [
        line for line in log.splitlines() if SECRET in line
    ]  # ...the secret is not
    agent = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert not [line for line in agent if SECRET in line]
