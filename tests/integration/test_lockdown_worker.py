"""A real worker runs JSON and toolexec's registered tools, and nothing else.

* A worker whose Celery configuration allows pickle, from a ``--config`` style module or
  from an app module of the user's own, exits at start saying why.
* A pickled message is never unpickled: its payload would create a file, and none appears.
* A message naming another Celery task (a built-in, or a dotted path like ``os.system``)
  is not run; one naming a tool that is not registered, dotted or not, gets NOT_FOUND.
* ``celery inspect registered`` lists toolexec's two tasks and nothing else.
* The client reads replies as JSON only: a pickled reply frame is never unpickled, and
  the caller hears at once that the reply did not parse.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from agent_client import ToolClient, ToolExecutionError, remote_tool
from agent_client.prepare import PreparedCall, prepare_call
from agent_client.validation import ArgumentValidator
from tests.integration.conftest import PROJECT_ROOT
from tests.worker.support import next_reply
from toolexec import ProcessStartFailed, WorkerProcess
from wire import keys
from wire.models import CallOutcome, ErrorKind, ToolSpec, WorkerInfo
from wire.settings import Settings

pytestmark = pytest.mark.integration

TOOL_MODULES = "tasks,tests.integration.security_tools"
QUEUE = "security"
RECORD = ToolSpec(
    name="record",
    description="d",
    queue=QUEUE,
    parameters={"type": "object", "properties": {"tag": {"type": "string"}}, "required": ["tag"]},
)


class AppWorker(WorkerProcess):
    """toolexec's worker launcher, running another Celery app module (``-A module``)."""

    def __init__(self, app: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.app = app

    def argv(self) -> list[str]:
        """The stock command line with ``-A`` pointing at ``self.app``."""
        argv = super().argv()
        argv[argv.index("executor")] = self.app
        return argv


@pytest.fixture(scope="module")
def env(settings_env: dict[str, str]) -> dict[str, str]:
    """The session's settings with the security tools."""
    return {**settings_env, "TOOLEXEC_TOOL_MODULES": TOOL_MODULES}


@pytest.fixture(scope="module")
def worker(
    env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """A solo worker on the ``security`` queue: it takes messages one at a time, in order."""
    started = WorkerProcess(
        name=f"lockdown-{uuid.uuid4().hex[:8]}",
        pool="solo",
        concurrency=1,
        queues=(QUEUE,),
        env=env,
        cwd=PROJECT_ROOT,
        log_dir=tmp_path_factory.mktemp("lockdown-worker"),
    )
    with started:
        yield started


def prepared(spec: ToolSpec, arguments: dict[str, Any], settings: Settings) -> PreparedCall:
    """The call as the client writes it, without the catalog check (the tool may not exist)."""
    validator = ArgumentValidator(spec.name, spec.parameters, max_bytes=settings.max_argument_bytes)
    return prepare_call(
        spec,
        arguments,
        validator=validator,
        settings=settings,
        call_id=uuid.uuid4().hex,
        reply_to=f"lockdown-{uuid.uuid4().hex[:8]}",
        timeout=30.0,
        run_id=None,
        idempotency_key=None,
        origin="test",
    )


def served_after(redis_client: redis.Redis, settings: Settings, data_dir: Path) -> CallOutcome:
    """Push a ``record`` call behind what is queued and wait for its outcome.

    The solo worker takes messages in order, so once it answers, it has dealt with
    every message pushed before.
    """
    call = prepared(RECORD, {"tag": f"after-{uuid.uuid4().hex[:8]}"}, settings)
    redis_client.lpush(QUEUE, call.envelope)
    _call_id, outcome = next_reply(redis_client, call.request.reply_to, timeout=20)
    return outcome


def test_a_pickled_message_is_never_unpickled(
    worker: WorkerProcess, redis_client: redis.Redis, env: dict[str, str], tmp_path: Path
) -> None:
    settings = Settings.from_env(env)
    marker = tmp_path / "unpickled"

    class Payload:
        def __reduce__(self) -> tuple[Any, tuple[str, str]]:
            return (open, (str(marker), "w"))  # unpickling it creates the file

    call = prepared(RECORD, {"tag": "pickled"}, settings)
    envelope = json.loads(call.envelope)
    envelope["body"] = base64.b64encode(pickle.dumps(Payload())).decode()
    envelope["content-type"] = "application/x-python-serialize"
    envelope["content-encoding"] = "binary"
    redis_client.lpush(QUEUE, json.dumps(envelope))

    after = served_after(redis_client, settings, Path(env["TOOLEXEC_DATA_DIR"]))

    assert after.ok, after
    assert not marker.exists(), "the worker unpickled a message"
    assert (
        redis_client.llen(f"toolexec:reply:{call.request.reply_to}") == 0
    )  # and ran nothing for it
    assert worker.is_running


@pytest.mark.parametrize(
    "task_name", ["celery.backend_cleanup", "celery.chain", "os.system", "subprocess.check_call"]
)
def test_a_message_naming_any_other_celery_task_is_not_run(
    task_name: str,
    worker: WorkerProcess,
    redis_client: redis.Redis,
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    settings = Settings.from_env(env)
    marker = tmp_path / "ran"
    call = prepared(RECORD, {"tag": "foreign"}, settings)
    envelope = json.loads(call.envelope)
    envelope["headers"]["task"] = task_name
    command = f"touch {marker}"
    body = [[command], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    if task_name == "subprocess.check_call":
        body[0] = [["touch", str(marker)]]
    envelope["body"] = base64.b64encode(json.dumps(body).encode()).decode()
    redis_client.lpush(QUEUE, json.dumps(envelope))

    after = served_after(redis_client, settings, Path(env["TOOLEXEC_DATA_DIR"]))

    assert after.ok, after
    assert not marker.exists(), f"the worker ran {task_name}"
    assert worker.is_running


@pytest.mark.parametrize("tool_name", ["no_such_tool", "os.system", "tasks.flights.book_flight"])
def test_a_tool_that_is_not_registered_gets_not_found_by_its_name_alone(
    tool_name: str, worker: WorkerProcess, redis_client: redis.Redis, env: dict[str, str]
) -> None:
    settings = Settings.from_env(env)
    spec = RECORD.model_copy(update={"name": tool_name})
    call = prepared(spec, {"tag": "x"}, settings)
    redis_client.lpush(QUEUE, call.envelope)

    _call_id, outcome = next_reply(redis_client, call.request.reply_to, timeout=20)

    assert outcome.error is not None and outcome.error.kind is ErrorKind.NOT_FOUND
    assert repr(tool_name) in outcome.error.message


def test_celery_inspect_lists_toolexecs_two_tasks_and_nothing_else(
    worker: WorkerProcess, env: dict[str, str]
) -> None:
    control = Celery("lockdown-inspect", broker=env["TOOLEXEC_BROKER_URL"], set_as_current=False)
    try:
        registered = control.control.inspect(
            destination=[f"{worker.name}@{os.uname().nodename}"], timeout=5
        ).registered()
    finally:
        control.close()

    assert registered == {
        f"{worker.name}@{os.uname().nodename}": [
            "toolexec.run_tool",
            "toolexec.run_tool_at_least_once",
        ]
    }


@pytest.mark.parametrize("how", ["config module", "app module"])
def test_a_worker_whose_celery_configuration_allows_pickle_exits_at_start_saying_why(
    how: str, env: dict[str, str], tmp_path: Path
) -> None:
    modules = tmp_path / "modules"
    modules.mkdir()
    suffix = uuid.uuid4().hex[:8]
    # C_FORCE_ROOT turns off Celery's own refusal of pickle under root: toolexec's holds anyway.
    extra = {"PYTHONPATH": os.pathsep.join([str(modules), str(PROJECT_ROOT)]), "C_FORCE_ROOT": "1"}
    app = "executor"
    if how == "config module":
        # What `celery --config picklecfg` and a celeryconfig.py do: CELERY_CONFIG_MODULE.
        (modules / f"picklecfg_{suffix}.py").write_text('event_serializer = "pickle"\n')
        extra["CELERY_CONFIG_MODULE"] = f"picklecfg_{suffix}"
    else:
        (modules / f"myapp_{suffix}.py").write_text(
            "from executor.seams.app import create_app\n\n"
            "app = create_app()\n"
            'app.conf.update(accept_content=["pickle", "json"], task_serializer="pickle")\n'
        )
        app = f"myapp_{suffix}"
    worker = AppWorker(
        app,
        name=f"pickle-{suffix}",
        pool="solo",
        concurrency=1,
        queues=(QUEUE,),
        env={**env, **extra},
        cwd=PROJECT_ROOT,
        log_dir=tmp_path / "worker",
    )
    try:
        with pytest.raises(ProcessStartFailed, match="exited with 1"):
            worker.start(wait=True, timeout=60)
    finally:
        worker.stop()
    log = worker.log_path.read_text()

    assert "toolexec workers read and write JSON only" in log, log[-3000:]
    expected = (
        "event_serializer='pickle'"
        if how == "config module"
        else "accept_content=['pickle', 'json']"
    )
    assert expected in log
    assert "pickled message runs code of its sender's choosing" in log


def test_the_client_never_unpickles_a_reply_and_tells_the_caller_it_did_not_parse(
    redis_client: redis.Redis, env: dict[str, str], tmp_path: Path
) -> None:
    # A tool on a queue no worker consumes, published with a heartbeat as a worker would:
    # the test takes the call off the queue itself and answers it with a pickle.
    name, queue, worker_id = (
        f"lockdown_void_{uuid.uuid4().hex[:8]}",
        f"lockdown-void-{uuid.uuid4().hex[:8]}",
        uuid.uuid4().hex,
    )
    spec = ToolSpec(name=name, description="d", parameters={"type": "object"}, queue=queue)
    beat = WorkerInfo(
        worker_id=worker_id, hostname="fake@test", pid=1, queues=(queue,), tools=(name,)
    )
    redis_client.hset(keys.CATALOG, name, spec.model_dump_json())
    redis_client.set(keys.worker(worker_id), beat.model_dump_json(), ex=60)
    redis_client.sadd(keys.WORKERS, worker_id)
    marker = tmp_path / "unpickled"

    class Payload:
        def __reduce__(self) -> tuple[Any, tuple[str, str]]:
            return (open, (str(marker), "w"))  # unpickling it creates the file

    client = ToolClient(Settings.from_env(env))
    raised: list[BaseException] = []

    def call() -> None:
        try:
            remote_tool(name, client=client).invoke_sync({}, timeout=20)
        except BaseException as exc:  # noqa: BLE001 - the test looks at what it was
            raised.append(exc)

    caller = threading.Thread(target=call)
    try:
        caller.start()
        taken = redis_client.brpop([queue], timeout=10)
        assert taken is not None, "the client sent nothing"
        _args, fields, _embed = json.loads(base64.b64decode(json.loads(taken[1])["body"]))
        answered = time.monotonic()
        redis_client.rpush(
            keys.reply(fields["reply_to"]),
            fields["call_id"].encode() + b"\n" + pickle.dumps(Payload()),
        )
        caller.join(timeout=10)
        elapsed = time.monotonic() - answered
    finally:
        client.close()
        redis_client.hdel(keys.CATALOG, name)
        redis_client.delete(keys.worker(worker_id))
        redis_client.srem(keys.WORKERS, worker_id)

    assert not caller.is_alive() and len(raised) == 1
    refused = raised[0]
    assert isinstance(refused, ToolExecutionError) and refused.remote_type == "MalformedReply", (
        refused
    )
    assert "did not parse" in str(refused) and "Invalid JSON" in str(refused)
    assert elapsed < 5.0, f"the caller heard after {elapsed:.1f}s"
    assert not marker.exists(), "the client unpickled a reply"
