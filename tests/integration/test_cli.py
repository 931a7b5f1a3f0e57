"""The ``toolexec`` command, run as an operator runs it: a separate process, real workers.

The module's worker is started by ``toolexec worker`` itself (a :class:`ChildProcess`,
stopped by PID) and serves ``tests/integration/cli_tools.py`` on the ``cli`` queue,
which only it consumes. Every other command runs as ``python -m toolexec ...`` against
the session's private Redis, and each test reads its exit code, stdout and stderr.
"""

from __future__ import annotations

import hashlib
import json
import os
import pty
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from agent_client import ToolClient, ToolExecutionError, ToolTimeoutError, remote_tool
from toolexec import ChildProcess
from toolexec.status import BrokerUnreachable, amqp_queue_depths, status_snapshot
from wire import keys
from wire.models import WorkerInfo
from wire.settings import Settings

from .polling import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TOOL_MODULES = "tests.integration.cli_tools"
#: Arguments up to 4 MiB (the default is 1 MiB): the 2 MB argument test needs more.
MAX_ARGUMENT_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class CliWorker:
    """The worker ``toolexec worker`` started, and its heartbeat."""

    process: ChildProcess
    info: WorkerInfo


@pytest.fixture(scope="module")
def cli_env(settings_env: dict[str, str]) -> dict[str, str]:
    """The settings every command and the worker of this module run with."""
    return {
        **settings_env,
        "TOOLEXEC_TOOL_MODULES": TOOL_MODULES,
        "TOOLEXEC_MAX_ARGUMENT_BYTES": str(MAX_ARGUMENT_BYTES),
    }


def heartbeat_of(client: redis.Redis, pid: int) -> WorkerInfo | None:
    """The live heartbeat of the worker whose main process is ``pid``, if any."""
    for key in client.scan_iter(match=keys.worker("*"), count=500):
        raw = client.get(key)
        if raw is not None:
            info = WorkerInfo.model_validate_json(raw)
            if info.pid == pid:
                return info
    return None


@pytest.fixture(scope="module")
def cli_worker(
    cli_env: dict[str, str], redis_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CliWorker]:
    """``toolexec worker -Q cli -c 3`` at Celery's default log level, until the module ends."""
    process = ChildProcess(
        "cli-worker",
        [
            sys.executable,
            "-m",
            "toolexec",
            "worker",
            "-Q",
            "cli",
            "-c",
            "3",
            "-n",
            f"cli-{uuid.uuid4().hex[:8]}@%h",
        ],
        env={**os.environ, **cli_env},
        cwd=ROOT,
        log_dir=tmp_path_factory.mktemp("cli-worker"),
    )
    with process, redis.Redis.from_url(redis_server.url) as client:
        pid = process.pid
        assert pid is not None
        found: list[WorkerInfo] = []

        def beating() -> bool:
            info = heartbeat_of(client, pid)
            if info is not None:
                found.append(info)
            return bool(found) or not process.is_running

        assert wait_until(beating, timeout=60), process.log_tail()
        assert found, f"toolexec worker exited:\n{process.log_tail()}"
        yield CliWorker(process, found[0])


def run(
    *words: str,
    env: Mapping[str, str],
    extra_env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    timeout: float = 90,
) -> subprocess.CompletedProcess[str]:
    """``python -m toolexec WORDS`` with ``env`` over this process's environment."""
    return subprocess.run(
        [sys.executable, "-m", "toolexec", *words],
        env={**os.environ, **env, **(extra_env or {})},
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The command's stderr, checked to be one ``toolexec: ...`` line and no traceback."""
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("toolexec: "), done.stderr
    return lines[0]


@pytest.fixture(scope="module")
def client(cli_env: dict[str, str]) -> Iterator[ToolClient]:
    """An agent client of the private server, for making calls faster than the command."""
    tool_client = ToolClient(Settings.from_env(cli_env))
    yield tool_client
    tool_client.close()


# -- toolexec worker -------------------------------------------------------------------


def test_toolexec_worker_becomes_a_celery_worker_that_serves_calls_with_the_options_given(
    cli_worker: CliWorker, cli_env: dict[str, str]
) -> None:
    info = cli_worker.info

    assert info.pid == cli_worker.process.pid  # exec: the command's process is the worker
    assert (info.pool, info.concurrency, info.queues) == ("prefork", 3, ("cli",))
    assert {"cli_echo", "cli_fail", "cli_sleep", "cli_steps"} <= set(info.tools)
    assert "cli_idle" not in info.tools  # its queue is not consumed here

    done = run("call", "cli_echo", "text=served", env=cli_env)

    assert done.returncode == 0, done.stderr
    served_by = json.loads(done.stdout)["pid"]
    parent = int(Path(f"/proc/{served_by}/stat").read_text().rpartition(")")[2].split()[1])
    assert parent == cli_worker.process.pid  # a prefork child of that worker ran it


def test_a_worker_at_the_default_log_level_says_it_is_ready_and_which_tools_it_serves(
    cli_worker: CliWorker,
) -> None:
    log = cli_worker.process.log_path.read_text()
    info = cli_worker.info

    assert (
        f"toolexec worker {info.worker_id} ready: queues cli; tools {', '.join(info.tools)}" in log
    )
    assert "INFO/" not in log  # Celery's default level (WARNING): its own INFO lines are hidden


def test_toolexec_worker_with_a_tool_module_that_cannot_be_imported_fails_in_one_line(
    cli_env: dict[str, str],
) -> None:
    done = run(
        "worker",
        "-P",
        "solo",
        env=cli_env,
        extra_env={"TOOLEXEC_TOOL_MODULES": "no_such_tools_module"},
    )

    assert done.returncode == 8
    assert "no_such_tools_module" in one_line_error(done)


# -- toolexec call: arguments ----------------------------------------------------------


def test_key_value_words_are_json_when_they_parse_and_text_when_they_do_not(
    cli_worker: CliWorker, cli_env: dict[str, str]
) -> None:
    done = run("call", "cli_echo", "text=007", "number=42", "flags=[true, false]", env=cli_env)

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["text"], result["number"], result["flags"]) == ("007", 42, [True, False])


def test_a_two_megabyte_argument_travels_from_a_file(
    cli_worker: CliWorker, cli_env: dict[str, str], tmp_path: Path
) -> None:
    text = "x" * 2_000_000
    arguments = tmp_path / "arguments.json"
    arguments.write_text(json.dumps({"text": text, "number": 1}))

    done = run("call", "cli_echo", f"@{arguments}", "number=2", env=cli_env)

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["length"] == 2_000_000
    assert result["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert result["number"] == 2  # key=value words apply after the file


def test_arguments_can_come_from_standard_input(
    cli_worker: CliWorker, cli_env: dict[str, str]
) -> None:
    done = run(
        "call",
        "cli_echo",
        "-",
        "--run-id",
        "run-from-stdin",
        env=cli_env,
        stdin='{"text": "piped"}',
    )

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["text"], result["run_id"]) == ("piped", "run-from-stdin")


def test_call_json_output_parses_for_a_result_and_for_an_error(
    cli_worker: CliWorker, cli_env: dict[str, str]
) -> None:
    ok = run("call", "cli_echo", '{"text": "hi"}', "--json", env=cli_env)
    failed = run("call", "cli_fail", "message=boom", "--json", env=cli_env)

    assert ok.returncode == 0, ok.stderr
    document = json.loads(ok.stdout)
    assert (document["ok"], document["tool"], document["result"]["text"]) == (
        True,
        "cli_echo",
        "hi",
    )
    assert failed.returncode == 1
    error = json.loads(failed.stdout)
    assert error["ok"] is False
    assert error["error"]["type"] == "ToolExecutionError"
    assert (error["error"]["remote_type"], error["error"]["remote_message"]) == (
        "ValueError",
        "boom",
    )
    assert error["error"]["exit_code"] == 1


# -- toolexec call: exit codes ---------------------------------------------------------


@pytest.mark.parametrize(
    ("words", "code", "says"),
    [
        (["cli_fail", "message=boom"], 1, "ValueError: boom"),
        (["cli_echo", "text=x", "number=many"], 2, "ToolArgumentsInvalid"),
        (["cli_echo", "{not json"], 2, "not JSON"),
        (["cli_echo", "[1, 2]"], 2, "must be a JSON object, not a JSON list"),
        (["cli_sleep", "seconds=5", "--timeout", "0.5"], 3, "timed out after 0.5s"),
        (["cli_hard", "seconds=5"], 3, "hard limit"),
        (["no_such_tool"], 4, "ToolNotFound"),
    ],
    ids=[
        "tool-error",
        "schema",
        "bad-json",
        "not-an-object",
        "deadline",
        "hard-limit",
        "not-found",
    ],
)
def test_each_way_a_call_fails_has_its_exit_code_and_one_line_on_stderr(
    cli_worker: CliWorker, cli_env: dict[str, str], words: list[str], code: int, says: str
) -> None:
    done = run("call", *words, env=cli_env)

    assert done.returncode == code, done.stdout + done.stderr
    assert says in one_line_error(done)
    assert done.stdout == ""


def test_a_call_with_redis_unreachable_exits_5(cli_env: dict[str, str], closed_port: int) -> None:
    closed = f"redis://127.0.0.1:{closed_port}/0"

    done = run(
        "call",
        "cli_echo",
        "text=x",
        env=cli_env,
        extra_env={"TOOLEXEC_BROKER_URL": closed, "TOOLEXEC_REDIS_URL": closed},
    )

    assert done.returncode == 5
    assert "BrokerUnavailable" in one_line_error(done)


def test_a_call_whose_worker_process_dies_exits_6(
    cli_worker: CliWorker, cli_env: dict[str, str], redis_client: redis.Redis
) -> None:
    marker = f"cli-test:{uuid.uuid4().hex}"
    call = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "toolexec",
            "call",
            "cli_sleep",
            "seconds=60",
            f"marker={marker}",
            "--timeout",
            "90",
        ],
        env={**os.environ, **cli_env},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_until(lambda: redis_client.get(marker) is not None, timeout=60)
        child = int(redis_client.get(marker) or 0)
        assert child in cli_worker_children(cli_worker)
        os.kill(child, signal.SIGKILL)  # a pool child of the module's worker; Celery replaces it
        out, err = call.communicate(timeout=60)
    finally:
        if call.poll() is None:
            call.kill()
            call.wait()

    assert call.returncode == 6, out + err
    assert "WorkerLost" in err and "Traceback" not in err


def cli_worker_children(worker: CliWorker) -> list[int]:
    """PIDs whose parent is the worker's main process."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 1 and int(fields[1]) == worker.process.pid:
            children.append(int(stat.parent.name))
    return children


class StallingProxy:
    """A TCP proxy to Redis that forwards everything until a client sends a call.

    A call goes out as ``LPUSH`` or as a script that pushes it (``EVALSHA``/``EVAL``).

    From then on that connection's bytes go nowhere and it stays open: Redis stalls
    after the call was written, as far as the client can tell.
    """

    def __init__(self, port: int) -> None:
        self._target = ("127.0.0.1", port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = [self._listener]
        self.stalled = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            server = socket.create_connection(self._target)
            self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, from_client: bool) -> None:
        stalled = False
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                return
            if not data:
                return
            if from_client and any(command in data.upper() for command in (b"LPUSH", b"EVAL")):
                stalled = True
                self.stalled.set()
            if stalled:
                continue
            try:
                target.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        """Close the listener and every connection."""
        for sock in self._sockets:
            sock.close()


def test_a_call_that_may_have_reached_redis_without_a_reply_exits_7(
    cli_worker: CliWorker, cli_env: dict[str, str], redis_server: Any
) -> None:
    proxy = StallingProxy(redis_server.port)
    url = f"redis://127.0.0.1:{proxy.port}/0"
    try:
        done = run(
            "call",
            "cli_sleep",
            "seconds=0",
            "--timeout",
            "1",
            env=cli_env,
            extra_env={"TOOLEXEC_BROKER_URL": url, "TOOLEXEC_REDIS_URL": url},
        )
    finally:
        proxy.close()

    assert done.returncode == 7, done.stdout + done.stderr
    assert proxy.stalled.is_set()  # the call was written
    assert "ToolOutcomeUnknown" in one_line_error(done)


# -- bad input: one line and a documented code, never a traceback ----------------------


#: What a broker URL toolexec cannot carry calls over gets, from every command.
_NOT_A_BROKER = (
    "TOOLEXEC_BROKER_URL: must be a Redis (redis://, rediss://, unix://, sentinel://) or RabbitMQ"
)


@pytest.mark.parametrize(
    ("words", "extra_env", "code", "says"),
    [
        (
            ["call", "cli_echo", "text=x", "--timeout", "soon"],
            {},
            2,
            "--timeout must be a positive number",
        ),
        (
            ["call", "cli_echo", "text=x", "--timeout", "-1"],
            {},
            2,
            "--timeout must be a positive number",
        ),
        (
            ["call", "cli_echo", "text=x", "--timeout", "1e300"],
            {},
            2,
            "at most 31622400 (366 days)",
        ),
        (["call", "cli_echo", "@/no/such/file.json"], {}, 2, "cannot read the arguments file"),
        (["call", "cli_echo", "text"], {}, 2, "is not a JSON object, key=value, @file or -"),
        (["status"], {"TOOLEXEC_DEFAULT_TIMEOUT": "-3"}, 8, "TOOLEXEC_DEFAULT_TIMEOUT"),
        (["tools"], {"TOOLEXEC_REDIS_URL": "http://127.0.0.1:80/"}, 8, "TOOLEXEC_REDIS_URL"),
        (
            ["call", "cli_echo", "text=x"],
            {"TOOLEXEC_BROKER_URL": "sqs://queue.example/"},
            8,
            _NOT_A_BROKER,
        ),
        (
            ["tools"],
            {"TOOLEXEC_BROKER_URL": "sqs://queue.example/", "TOOLEXEC_REDIS_URL": ""},
            8,
            _NOT_A_BROKER,
        ),
        (["status"], {"TOOLEXEC_BROKER_URL": "http://queue.example/"}, 8, _NOT_A_BROKER),
        (
            ["tools"],
            {"TOOLEXEC_BROKER_URL": "amqp://guest:guest@127.0.0.1//", "TOOLEXEC_REDIS_URL": ""},
            8,
            "TOOLEXEC_REDIS_URL is required",
        ),
        (["worker"], {"TOOLEXEC_HEARTBEAT_INTERVAL": "often"}, 8, "TOOLEXEC_HEARTBEAT_INTERVAL"),
    ],
    ids=[
        "word-timeout",
        "negative-timeout",
        "huge-timeout",
        "missing-file",
        "bare-word",
        "bad-setting",
        "http-redis-url",
        "sqs-broker",
        "sqs-broker-no-redis-url",
        "http-broker",
        "amqp-no-redis-url",
        "worker-bad-setting",
    ],
)
def test_bad_input_is_one_line_and_an_exit_code_never_a_traceback(
    cli_env: dict[str, str], words: list[str], extra_env: dict[str, str], code: int, says: str
) -> None:
    done = run(*words, env=cli_env, extra_env=extra_env)

    assert done.returncode == code, done.stdout + done.stderr
    assert says in one_line_error(done)


def test_a_usage_error_exits_2_without_a_traceback(cli_env: dict[str, str]) -> None:
    done = run("worker", "--pool", "fibers", env=cli_env)

    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "fibers" in done.stderr


# -- toolexec tools --------------------------------------------------------------------


def test_tools_json_lists_each_live_tool_with_its_queue_timeout_delivery_and_workers(
    cli_worker: CliWorker, cli_env: dict[str, str]
) -> None:
    done = run("tools", "--json", env=cli_env)

    assert done.returncode == 0, done.stderr
    rows = {row["name"]: row for row in json.loads(done.stdout)}
    echo = rows["cli_echo"]
    assert (echo["queue"], echo["idempotent"], echo["timeout"], echo["timeout_from"]) == (
        "cli",
        True,
        30,
        "tool",
    )
    assert echo["delivery"] == "at_least_once"  # an idempotent tool's default
    assert rows["cli_sleep"]["delivery"] == "at_most_once"
    assert cli_worker.info.worker_id in echo["workers"]
    assert rows["cli_sleep"]["timeout_from"] == "settings"
    assert "cli_idle" not in rows  # no live worker serves it
    assert (rows["cli_approved"]["requires_approval"], echo["requires_approval"]) == (True, False)
    assert echo["on_abandon"] == "leave"


@pytest.mark.parametrize("columns", ["80", "200"])
def test_tools_without_json_prints_every_field_whole_in_a_terminal_of_any_width(
    cli_worker: CliWorker, cli_env: dict[str, str], columns: str
) -> None:
    done = run("tools", env=cli_env, extra_env={"COLUMNS": columns})

    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout
    for field in ("cli_echo", cli_worker.info.worker_id, "at least once", "30s", "required"):
        assert field in done.stdout, f"{field!r} missing at {columns} columns:\n{done.stdout}"


def test_tools_with_no_live_worker_says_so_and_exits_4(
    redis_server: Any, cli_env: dict[str, str]
) -> None:
    empty = redis_server.url.rsplit("/", 1)[0] + "/9"  # a database no worker uses

    done = run(
        "tools",
        "--json",
        env=cli_env,
        extra_env={"TOOLEXEC_BROKER_URL": empty, "TOOLEXEC_REDIS_URL": empty},
    )

    assert done.returncode == 4
    assert json.loads(done.stdout) == []
    assert "no live worker" in one_line_error(done)


# -- toolexec status -------------------------------------------------------------------


def test_status_shows_the_worker_queue_depths_calls_per_tool_and_dead_letters(
    cli_worker: CliWorker, cli_env: dict[str, str], client: ToolClient, redis_client: redis.Redis
) -> None:
    before = status_snapshot(redis_client)
    echo, fail, hard = (
        remote_tool(name, client=client) for name in ("cli_echo", "cli_fail", "cli_hard")
    )
    for n in range(3):
        echo.invoke_sync({"text": f"status {uuid.uuid4().hex} {n}"})
    with pytest.raises(ToolExecutionError):
        fail.invoke_sync({"message": "counted"})
    with pytest.raises(ToolExecutionError, match="hard limit"):
        hard.invoke_sync({"seconds": 3})
    idle = "cli-idle"
    redis_client.delete(idle)
    redis_client.lpush(idle, "one", "two", "three")  # nobody consumes this queue
    redis_client.lpush("cli", "not a message")  # the worker refuses it: one dead letter

    def calls(snapshot: dict[str, Any], window: str, tool: str, category: str) -> int:
        return int(snapshot["calls"][window].get(tool, {}).get(category, 0))

    def counted() -> bool:
        # Counted since `before` in the last hour, which nothing of this run leaves: the
        # last minute slides by 10 s buckets, and the calls of earlier tests leave it
        # while this one waits. The new calls are in the last minute too.
        now = status_snapshot(redis_client)
        wanted = (("cli_echo", "done", 3), ("cli_fail", "failed", 1), ("cli_hard", "timed_out", 1))
        return (
            all(
                calls(now, "last_hour", tool, category)
                >= calls(before, "last_hour", tool, category) + n
                and calls(now, "last_minute", tool, category) >= n
                for tool, category, n in wanted
            )
            and now["deadletter"]["count"] >= before["deadletter"]["count"] + 1
        )

    try:
        assert wait_until(counted, timeout=20), status_snapshot(redis_client)
        done = run("status", "--json", env=cli_env)
    finally:
        redis_client.delete(idle)

    assert done.returncode == 0, done.stderr
    snapshot = json.loads(done.stdout)
    workers = {w["worker_id"]: w for w in snapshot["workers"]}
    mine = workers[cli_worker.info.worker_id]
    assert (mine["queues"], mine["pool"], mine["concurrency"]) == (["cli"], "prefork", 3)
    assert 0 <= mine["heartbeat_age"] < 5
    assert snapshot["queues"][idle] == 3
    assert snapshot["queues"]["cli"] == 0
    hour = snapshot["calls"]["last_hour"]
    assert hour["cli_echo"]["done"] >= 3 and hour["cli_fail"]["failed"] >= 1
    assert hour["cli_hard"]["by_kind"].get("hard_timeout", 0) >= 1
    assert snapshot["deadletter"]["by_reason"].get("not_json", 0) >= 1


def test_status_reads_queue_depths_from_a_broker_apart_from_the_catalogs_redis(
    cli_worker: CliWorker, redis_server: Any, redis_client: redis.Redis
) -> None:
    broker_url = redis_server.url.rsplit("/", 1)[0] + "/3"  # another database as the broker
    with redis.Redis.from_url(broker_url) as broker:
        broker.delete("cli")
        broker.lpush("cli", "a", "b")
        try:
            snapshot = status_snapshot(redis_client, broker_url=broker_url)
        finally:
            broker.delete("cli")

    assert snapshot["queues"]["cli"] == 2


def test_rabbitmq_queue_depths_come_from_a_passive_declare() -> None:
    from kombu import Connection, Queue

    url = "amqp://guest:guest@127.0.0.1:5672//"
    name, missing = f"toolexec-cli-test-{uuid.uuid4().hex}", f"toolexec-cli-test-{uuid.uuid4().hex}"
    with Connection(url, connect_timeout=5) as connection:
        queue = Queue(name, routing_key=name, durable=False, channel=connection.channel())
        queue.declare()
        try:
            with connection.Producer() as producer:
                for n in range(2):
                    producer.publish({"n": n}, routing_key=name, serializer="json")
            depths = amqp_queue_depths(url, [name, missing])
        finally:
            queue.delete()

    assert depths == {name: 2, missing: 0}
    with pytest.raises(BrokerUnreachable, match="RabbitMQ at 127.0.0.1:1"):
        amqp_queue_depths("amqp://guest:guest@127.0.0.1:1//", [name], timeout=1)


def test_status_counts_the_calls_a_worker_is_running(
    cli_worker: CliWorker, client: ToolClient, redis_client: redis.Redis
) -> None:
    marker = f"cli-test:{uuid.uuid4().hex}"
    sleep = remote_tool("cli_sleep", client=client)

    def mine() -> dict[str, Any]:
        snapshot = status_snapshot(redis_client, worker=cli_worker.info.worker_id)
        return dict(snapshot["workers"][0])

    with pytest.raises(ToolTimeoutError):
        # Leaves the call running on the worker for 4 s after the caller gave up.
        sleep.invoke_sync({"seconds": 4, "marker": marker}, timeout=0.5)
    assert wait_until(lambda: redis_client.get(marker) is not None, timeout=10)

    assert wait_until(lambda: mine()["running"] >= 1, timeout=5), mine()
    assert wait_until(lambda: mine()["running"] == 0, timeout=15), mine()


def test_status_without_json_prints_tables_of_workers_queues_and_calls(
    cli_worker: CliWorker, cli_env: dict[str, str]
) -> None:
    done = run("status", env=cli_env, extra_env={"COLUMNS": "200"})

    assert done.returncode == 0, done.stderr
    for expected in (cli_worker.info.worker_id, "queues", "cli-idle", "dead-lettered"):
        assert expected in done.stdout


def test_status_for_one_worker_exits_4_when_it_is_not_live(
    cli_worker: CliWorker, cli_env: dict[str, str]
) -> None:
    host = cli_worker.info.hostname.partition("@")[2]
    live = run("status", "--json", "--worker", cli_worker.info.hostname, env=cli_env)
    gone = run("status", "--json", "--worker", f"nobody@{host}", env=cli_env)

    assert live.returncode == 0, live.stderr
    assert [w["worker_id"] for w in json.loads(live.stdout)["workers"]] == [
        cli_worker.info.worker_id
    ]
    assert gone.returncode == 4
    assert json.loads(gone.stdout)["workers"] == []
    assert json.loads(gone.stdout)["worker_filter"] == f"nobody@{host}"
    assert "no live worker named" in one_line_error(gone)
    # The table says the same: that no worker of that name is live, not that none is.
    table = run("status", "--worker", f"nobody@{host}", env=cli_env, extra_env={"COLUMNS": "200"})
    assert table.returncode == 4
    assert f"no live worker named 'nobody@{host}'" in table.stdout


def test_status_watch_prints_one_snapshot_per_interval_until_interrupted(
    cli_worker: CliWorker, cli_env: dict[str, str]
) -> None:
    # Ctrl-C is SIGINT, which a process started from a background job inherits as
    # ignored (Python then installs no KeyboardInterrupt): give the command Python's own.
    interruptible = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.argv = ['toolexec', *sys.argv[1:]]; runpy.run_module('toolexec', run_name='__main__')"
    )
    watch = subprocess.Popen(
        [sys.executable, "-c", interruptible, "status", "--json", "--watch", "--interval", "0.2"],
        env={**os.environ, **cli_env},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watch.stdout is not None
        snapshots = [json.loads(watch.stdout.readline()) for _ in range(3)]
        watch.send_signal(signal.SIGINT)
        _, err = watch.communicate(timeout=30)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()

    assert watch.returncode == 0, err
    assert all(isinstance(s["workers"], list) and "default" in s["queues"] for s in snapshots)
    assert snapshots[0]["time"] < snapshots[1]["time"] < snapshots[2]["time"]
    assert "Traceback" not in err


# -- progress on a terminal -------------------------------------------------------------


def test_a_tool_reporting_progress_draws_a_bar_on_a_terminal_and_nothing_on_a_pipe(
    cli_worker: CliWorker, cli_env: dict[str, str]
) -> None:
    master, terminal = pty.openpty()
    chunks: list[bytes] = []
    reader = threading.Thread(target=read_all, args=(master, chunks), daemon=True)
    try:
        call = subprocess.Popen(
            [sys.executable, "-m", "toolexec", "call", "cli_steps", "steps=4", "pause=0.4"],
            env={**os.environ, **cli_env, "COLUMNS": "100", "TERM": "xterm"},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=terminal,
            text=True,
        )
        os.close(terminal)
        reader.start()
        out, _ = call.communicate(timeout=90)
        reader.join(timeout=30)
    finally:
        os.close(master)
    drawn = b"".join(chunks).decode(errors="replace")
    piped = run("call", "cli_steps", "steps=2", "pause=0.1", env=cli_env)

    assert call.returncode == 0
    assert json.loads(out) == {"steps": 4}
    assert "step 4 of 4" in drawn and "4/4" in drawn  # the last report always arrives
    assert piped.returncode == 0 and piped.stderr == ""


def read_all(fd: int, chunks: list[bytes]) -> None:
    """Read a pty's master side into ``chunks`` until its slave side is closed and drained."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the other side is closed and drained
            return
        if not chunk:
            return
        chunks.append(chunk)


# -- toolexec doctor -------------------------------------------------------------------


def test_doctor_prints_its_checks_as_json_and_exits_1_when_one_fails(
    cli_worker: CliWorker, cli_env: dict[str, str]
) -> None:
    done = run("doctor", "--json", env=cli_env)

    checks = {check["name"]: check for check in json.loads(done.stdout)}
    # The session's private Redis keeps no append-only file, and cli_echo is idempotent.
    assert checks["persistence"]["ok"] is False and checks["persistence"]["fix"]
    assert done.returncode == 1, done.stderr


# -- toolexec demo ---------------------------------------------------------------------


def test_a_failed_demo_keeps_the_logs_of_what_it_started_and_says_where(tmp_path: Path) -> None:
    kept = tmp_path / "kept"

    done = run(
        "demo", "--logs", str(kept), env={"TOOLEXEC_TOOL_MODULES": "no_such_module_for_the_demo"}
    )

    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert f"kept in {kept}" in done.stderr
    worker_log = kept / "logs" / "demo1.log"
    assert "no_such_module_for_the_demo" in worker_log.read_text()
    assert (kept / "redis" / "redis.log").exists()
    assert str(kept) in done.stderr.splitlines()[0]  # the error points at the kept copy


def test_main_returns_the_exit_code_instead_of_exiting(monkeypatch: pytest.MonkeyPatch) -> None:
    from toolexec.cli import main

    monkeypatch.setenv("TOOLEXEC_DEFAULT_TIMEOUT", "-1")

    assert main(["--help"]) == 0
    assert main(["status"]) == 8
    assert main(["call"]) == 2
