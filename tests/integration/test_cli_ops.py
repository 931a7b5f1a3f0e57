"""The command as an operator meets it when something is away: a broker down, Redis down,
metrics for a scraper elsewhere, a call with no deadline, a demo that fails, a live view.

Each test runs the real ``python -m toolexec`` in a process of its own, against the
session's private Redis and real workers (``toolexec worker``, or the fixtures').
RabbitMQ, shared with others, is made unreachable by a proxy the test stops
(``broker_support.TcpProxy``), never stopped itself.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from toolexec import ChildProcess, WorkerProcess, free_port
from wire.models import WorkerInfo

from .broker_support import AMQP_URL, TcpProxy
from .polling import wait_until
from .test_cli import TOOL_MODULES, heartbeat_of, one_line_error, run

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ops_env(settings_env: dict[str, str]) -> dict[str, str]:
    """The settings of this module's commands and workers: the CLI test tools."""
    return {**settings_env, "TOOLEXEC_TOOL_MODULES": TOOL_MODULES}


@pytest.fixture(scope="module")
def ops_worker(
    ops_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerInfo]:
    """A worker of the CLI tools on ``cli`` (the Redis broker); its heartbeat."""
    worker = WorkerProcess(
        name=f"ops-{uuid.uuid4().hex[:8]}",
        pool="prefork",
        concurrency=2,
        queues=("cli",),
        env=ops_env,
        cwd=ROOT,
        log_dir=tmp_path_factory.mktemp("ops-worker"),
    )
    with worker:
        assert worker.info is not None
        yield worker.info


def _answers(host: str, port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=2.0) as response:
            return b"toolexec_" in response.read() or response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


# -- metrics on another address --------------------------------------------------------


def test_toolexec_worker_serves_metrics_on_the_address_metrics_host_names_and_on_127_0_0_1_by_default(  # noqa: E501
    ops_env: dict[str, str], redis_client: redis.Redis, tmp_path: Path
) -> None:
    """127.0.0.2 stands for an address other than the default (a container's 0.0.0.0
    is docker-compose.yml's, checked in tests/unit/test_compose.py)."""
    elsewhere, default = free_port(), free_port()

    def worker(port: int, *extra: str) -> ChildProcess:
        words = [
            "worker",
            "-Q",
            f"cli-metrics-{port}",
            "-c",
            "1",
            "--metrics-port",
            str(port),
            *extra,
        ]
        return ChildProcess(
            f"metrics-{port}",
            [sys.executable, "-m", "toolexec", *words],
            env={**os.environ, **ops_env},
            cwd=ROOT,
            log_dir=tmp_path,
        )

    def beating(process: ChildProcess) -> bool:
        pid = process.pid
        assert pid is not None
        return heartbeat_of(redis_client, pid) is not None or not process.is_running

    with worker(elsewhere, "--metrics-host", "127.0.0.2") as first, worker(default) as second:
        for process in (first, second):
            assert wait_until(functools.partial(beating, process), timeout=60)
            assert process.is_running, process.log_tail()
        assert wait_until(lambda: _answers("127.0.0.2", elsewhere), timeout=10), first.log_tail()
        assert wait_until(lambda: _answers("127.0.0.1", default), timeout=10), second.log_tail()
        # Each listens on its address only.
        assert not _answers("127.0.0.1", elsewhere)
        assert not _answers("127.0.0.2", default)


# -- the broker down -------------------------------------------------------------------


def test_status_with_rabbitmq_down_names_rabbitmq_shows_the_rest_and_exits_5(
    ops_worker: WorkerInfo, ops_env: dict[str, str]
) -> None:
    proxy = TcpProxy(5672).start()
    broker = AMQP_URL.replace(":5672/", f":{proxy.port}/")
    try:
        up = run("status", "--json", env=ops_env, extra_env={"TOOLEXEC_BROKER_URL": broker})
        proxy.stop()
        down = run("status", "--json", env=ops_env, extra_env={"TOOLEXEC_BROKER_URL": broker})
        table = run(
            "status", env=ops_env, extra_env={"TOOLEXEC_BROKER_URL": broker, "COLUMNS": "200"}
        )
    finally:
        proxy.stop()

    assert up.returncode == 0, up.stderr
    assert "cli" in json.loads(up.stdout)["queues"]
    assert down.returncode == 5, down.stdout + down.stderr
    error = one_line_error(down)
    assert f"RabbitMQ at 127.0.0.1:{proxy.port}" in error and "unreachable" in error
    assert "Redis" not in error, error
    snapshot = json.loads(down.stdout)
    assert snapshot["queues"] == {} and "RabbitMQ" in snapshot["broker_error"]
    assert ops_worker.worker_id in [w["worker_id"] for w in snapshot["workers"]]
    assert table.returncode == 5
    assert ops_worker.worker_id in table.stdout and "queue depths unknown" in table.stdout


def test_a_workers_healthcheck_passes_while_the_broker_is_down_and_fails_for_a_worker_that_is_not_live(  # noqa: E501
    ops_worker: WorkerInfo, ops_env: dict[str, str], closed_port: int
) -> None:
    """What docker-compose.yml's worker healthcheck runs: a RabbitMQ outage must not make
    every worker unhealthy (and restarted) at once."""
    down = {"TOOLEXEC_BROKER_URL": f"amqp://guest:guest@127.0.0.1:{closed_port}//"}

    live = run("status", "--json", "--worker", ops_worker.hostname, env=ops_env, extra_env=down)
    gone = run("status", "--json", "--worker", "nobody@nowhere", env=ops_env, extra_env=down)

    assert live.returncode == 0, live.stdout + live.stderr
    assert [w["worker_id"] for w in json.loads(live.stdout)["workers"]] == [ops_worker.worker_id]
    assert gone.returncode == 4
    assert "no live worker named" in one_line_error(gone)


@pytest.mark.parametrize(
    "command", [["tools"], ["tools", "--json"], ["status"], ["status", "--json"]]
)
def test_tools_and_status_exit_5_in_one_line_when_redis_is_unreachable(
    command: list[str], ops_env: dict[str, str], closed_port: int
) -> None:
    closed = f"redis://127.0.0.1:{closed_port}/0"

    done = run(
        *command,
        env=ops_env,
        extra_env={"TOOLEXEC_BROKER_URL": closed, "TOOLEXEC_REDIS_URL": closed},
    )

    assert done.returncode == 5, done.stdout + done.stderr
    assert f"Redis at {closed} is unreachable" in one_line_error(done)
    assert done.stdout == ""


# -- a call with no deadline -----------------------------------------------------------


def test_call_with_timeout_none_waits_past_the_default_deadline_for_its_result(
    ops_worker: WorkerInfo, ops_env: dict[str, str]
) -> None:
    short = {"TOOLEXEC_DEFAULT_TIMEOUT": "0.5"}
    words = ["call", "cli_sleep", "seconds=1.5", "--json"]

    bounded = run(*words, env=ops_env, extra_env=short)
    unbounded = run(*words, "--timeout", "none", env=ops_env, extra_env=short)

    assert bounded.returncode == 3, bounded.stdout + bounded.stderr
    assert unbounded.returncode == 0, unbounded.stdout + unbounded.stderr
    reply: dict[str, Any] = json.loads(unbounded.stdout)
    assert reply["ok"] is True and "pid" in json.dumps(reply["result"])


# -- the demo, the live view -----------------------------------------------------------


def test_a_failed_demo_without_logs_keeps_them_in_a_new_directory_it_names(tmp_path: Path) -> None:
    done = run(
        "demo",
        env={"TOOLEXEC_TOOL_MODULES": "no_such_module_for_the_demo", "TMPDIR": str(tmp_path)},
    )

    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    named = re.search(r"kept in (\S+)", done.stderr)
    assert named, done.stderr
    kept = Path(named.group(1))
    try:
        assert kept.is_dir(), f"{kept} does not exist"
        assert kept.parent == tmp_path  # a new directory of its own, not the deleted one
        assert "no_such_module_for_the_demo" in (kept / "logs" / "demo1.log").read_text()
        assert (kept / "redis" / "redis.log").exists()
        assert [p.name for p in tmp_path.iterdir()] == [kept.name]  # the rest is removed
    finally:
        shutil.rmtree(kept, ignore_errors=True)


def test_status_watch_draws_its_tables_the_number_of_times_count_says_and_exits_0(
    ops_worker: WorkerInfo, ops_env: dict[str, str]
) -> None:
    done = run(
        "status",
        "--watch",
        "--count",
        "2",
        "--interval",
        "0.2",
        env=ops_env,
        extra_env={"COLUMNS": "200"},
        timeout=60,
    )
    json_lines = run(
        "status", "--watch", "--json", "--count", "3", "--interval", "0.1", env=ops_env
    )

    assert done.returncode == 0, done.stderr
    for expected in ("toolexec status at", ops_worker.worker_id, "queues", "dead-lettered"):
        assert expected in done.stdout
    assert json_lines.returncode == 0, json_lines.stderr
    snapshots = [json.loads(line) for line in json_lines.stdout.splitlines()]
    assert len(snapshots) == 3 and snapshots[0]["time"] < snapshots[2]["time"]
