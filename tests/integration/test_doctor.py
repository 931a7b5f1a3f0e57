"""``toolexec doctor`` against a private Redis: a healthy setup passes, each fault fails its check.

The deployment is the starter tools (``get_today_date`` is idempotent) on a private
redis-server with an append-only file. Each test breaks one rule and checks that the
doctor's check for it fails with a fix, and that the others still pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.integration.conftest import PROJECT_ROOT
from toolexec import RedisServer
from toolexec.doctor import Check, run_checks
from wire import keys
from wire.models import ToolSpec
from wire.settings import Settings

pytestmark = pytest.mark.integration

CHECKS = [
    "json-only",
    "ttls",
    "visibility-timeout",
    "transport-security",
    "persistence",
    "eviction",
    "signing",
    "same-tools-per-queue",
    "sentinels",
    "replica-acks",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private redis-server of the module's own (the tests change its configuration)."""
    with RedisServer(directory=tmp_path_factory.mktemp("doctor-redis")) as started:
        yield started


@pytest.fixture
def admin(server: RedisServer) -> Iterator[redis.Redis]:
    """A client of the server, emptied and with an append-only file: a healthy setup."""
    with redis.Redis.from_url(server.url) as client:
        client.flushall()
        client.config_set("appendonly", "yes")
        yield client


@pytest.fixture
def env(server: RedisServer, tmp_path: Path) -> dict[str, str]:
    """Settings of a healthy deployment: the starter tools on the private server."""
    return {
        "TOOLEXEC_BROKER_URL": server.url,
        "TOOLEXEC_REDIS_URL": server.url,
        "TOOLEXEC_TOOL_MODULES": "tasks",
        "TOOLEXEC_DATA_DIR": str(tmp_path / "data"),
    }


def by_name(checks: list[Check]) -> dict[str, Check]:
    """The checks by name; every check is there, once."""
    assert [check.name for check in checks] == CHECKS
    return {check.name: check for check in checks}


def failing(checks: list[Check]) -> list[str]:
    """The names of the checks that failed; each has a fix."""
    failed = [check for check in checks if not check.ok]
    assert all(check.fix for check in failed), failed
    return [check.name for check in failed]


def test_a_healthy_private_setup_passes_every_check(
    admin: redis.Redis, env: dict[str, str]
) -> None:
    admin.set(keys.reply("someone"), "x", ex=60)
    admin.hset(
        keys.CATALOG,
        "search",
        ToolSpec(name="search", description="d", parameters={}).model_dump_json(),
    )

    checks = by_name(run_checks(Settings.from_env(env)))

    assert failing(list(checks.values())) == []
    assert "get_today_date" in checks["persistence"].message


def test_the_command_prints_json_and_exits_0_when_healthy_1_when_not(
    admin: redis.Redis, env: dict[str, str]
) -> None:
    def doctor() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "toolexec.doctor", "--json"],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=PROJECT_ROOT,
            env={**os.environ, **env},
        )

    healthy = doctor()
    admin.config_set("appendonly", "no")
    broken = doctor()

    assert healthy.returncode == 0, healthy.stderr
    assert all(check["ok"] for check in json.loads(healthy.stdout))
    assert broken.returncode == 1, broken.stderr
    assert [c["name"] for c in json.loads(broken.stdout) if not c["ok"]] == ["persistence"]


def test_a_key_without_a_ttl_fails_the_ttl_check_naming_it(
    admin: redis.Redis, env: dict[str, str]
) -> None:
    admin.set("toolexec:stray", "forever")

    checks = run_checks(Settings.from_env(env))

    assert failing(checks) == ["ttls"]
    assert "toolexec:stray" in by_name(checks)["ttls"].message


def test_no_append_only_file_fails_the_persistence_check_when_idempotent_tools_exist(
    admin: redis.Redis, env: dict[str, str]
) -> None:
    admin.config_set("appendonly", "no")

    checks = run_checks(Settings.from_env(env))

    assert failing(checks) == ["persistence"]
    assert "appendonly yes" in by_name(checks)["persistence"].fix


def doctor_command(
    env: dict[str, str], *args: str, modules: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m toolexec doctor --json ARGS`` with ``env``; ``modules`` on its import path."""
    path = os.pathsep.join(str(p) for p in (modules, PROJECT_ROOT) if p is not None)
    return subprocess.run(
        [sys.executable, "-m", "toolexec", "doctor", "--json", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=PROJECT_ROOT,
        env={**os.environ, **env, "PYTHONPATH": path},
    )


def checks_of(done: subprocess.CompletedProcess[str]) -> dict[str, dict[str, object]]:
    """The command's checks by name; it printed every check, and no traceback."""
    assert "Traceback" not in done.stderr, done.stderr
    checks = json.loads(done.stdout)
    assert [check["name"] for check in checks] == CHECKS
    return {check["name"]: check for check in checks}


SLOW_TOOL = """
from executor import tool


@tool(hard_timeout=120)
def doctor_slow_tool() -> None:
    \"\"\"Take up to two minutes.\"\"\"
"""


def test_a_local_hard_limit_at_the_visibility_timeout_fails_that_check_and_json_only_still_reads_the_app(  # noqa: E501
    admin: redis.Redis, env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "doctor_slow_tools.py").write_text(SLOW_TOOL)
    slow = {
        **env,
        "TOOLEXEC_TOOL_MODULES": "tasks,doctor_slow_tools",
        "TOOLEXEC_VISIBILITY_TIMEOUT": "60",
    }

    done = doctor_command(slow, modules=tmp_path)
    checks = checks_of(done)

    assert done.returncode == 1
    assert [name for name, check in checks.items() if not check["ok"]] == ["visibility-timeout"]
    assert "doctor_slow_tool (120s" in str(checks["visibility-timeout"]["message"])
    assert checks["json-only"]["message"] == "the worker app reads and writes JSON only"


def test_celerys_one_second_margin_counts_against_the_visibility_timeout(
    admin: redis.Redis, env: dict[str, str]
) -> None:
    near = ToolSpec(name="near_the_limit", description="d", parameters={}, hard_timeout=59.5)
    admin.hset(keys.CATALOG, near.name, near.model_dump_json())

    at_60 = by_name(run_checks(Settings.from_env({**env, "TOOLEXEC_VISIBILITY_TIMEOUT": "60"})))
    at_61 = by_name(run_checks(Settings.from_env({**env, "TOOLEXEC_VISIBILITY_TIMEOUT": "61"})))

    assert not at_60["visibility-timeout"].ok
    assert "near_the_limit (59.5s, Celery's limit 60.5s)" in at_60["visibility-timeout"].message
    assert "above 60.5" in at_60["visibility-timeout"].fix
    assert at_61["visibility-timeout"].ok


PICKLE_APP = """
from executor.seams.app import create_app

app = create_app()
app.conf.update(accept_content=["json", "pickle"])
"""


def test_an_app_module_that_allows_pickle_fails_json_only_through_the_command(
    admin: redis.Redis, env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "doctor_pickle_app.py").write_text(PICKLE_APP)

    done = doctor_command(env, "--app", "doctor_pickle_app:app", modules=tmp_path)
    checks = checks_of(done)

    assert done.returncode == 1
    assert [name for name, check in checks.items() if not check["ok"]] == ["json-only"]
    assert "accept_content=['json', 'pickle']" in str(checks["json-only"]["message"])


def test_a_celery_config_module_that_allows_pickle_fails_json_only_through_the_command(
    admin: redis.Redis, env: dict[str, str], tmp_path: Path
) -> None:
    # What `celery worker --config doctor_pickle_config` reads; event_serializer is one
    # setting toolexec's app does not set itself, so the module's value stands.
    (tmp_path / "doctor_pickle_config.py").write_text('event_serializer = "pickle"\n')

    done = doctor_command({**env, "CELERY_CONFIG_MODULE": "doctor_pickle_config"}, modules=tmp_path)
    checks = checks_of(done)

    assert done.returncode == 1
    assert [name for name, check in checks.items() if not check["ok"]] == ["json-only"]
    assert "event_serializer='pickle'" in str(checks["json-only"]["message"])


def test_an_app_module_that_raises_fails_json_only_naming_the_error_while_the_other_checks_run(
    admin: redis.Redis, env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "doctor_slow_tools.py").write_text(SLOW_TOOL)
    (tmp_path / "doctor_own_app.py").write_text(
        "from executor.seams.app import create_app\n\napp = create_app()\n"
    )
    slow = {
        **env,
        "TOOLEXEC_TOOL_MODULES": "tasks,doctor_slow_tools",
        "TOOLEXEC_VISIBILITY_TIMEOUT": "60",
    }

    done = doctor_command(slow, "--app", "doctor_own_app:app", modules=tmp_path)
    checks = checks_of(done)

    # The app module's create_app() refuses the visibility timeout: json-only cannot read
    # the configuration and says why; visibility-timeout names the tool.
    assert [name for name, check in checks.items() if not check["ok"]] == [
        "json-only",
        "visibility-timeout",
    ]
    assert "doctor_own_app:app" in str(checks["json-only"]["message"])
    assert "TOOLEXEC_VISIBILITY_TIMEOUT (60s) must exceed" in str(checks["json-only"]["message"])
    assert "doctor_slow_tool (120s" in str(checks["visibility-timeout"]["message"])
    assert checks["persistence"]["ok"] and "get_today_date" in str(checks["persistence"]["message"])


def test_a_hard_limit_above_the_visibility_timeout_fails_naming_the_tool(
    admin: redis.Redis, env: dict[str, str]
) -> None:
    slow = ToolSpec(name="slow_elsewhere", description="d", parameters={}, hard_timeout=120.0)
    admin.hset(keys.CATALOG, slow.name, slow.model_dump_json())  # served by another worker

    checks = run_checks(Settings.from_env({**env, "TOOLEXEC_VISIBILITY_TIMEOUT": "60"}))

    assert failing(checks) == ["visibility-timeout"]
    assert (
        "slow_elsewhere (120s, Celery's limit 121s)"
        in by_name(checks)["visibility-timeout"].message
    )
    assert "above 121" in by_name(checks)["visibility-timeout"].fix


def test_a_worker_app_that_allows_pickle_fails_the_json_check(
    admin: redis.Redis, env: dict[str, str], tmp_path: Path
) -> None:
    from celery import Celery

    app = Celery("doctor-pickle", set_as_current=False)
    app.conf.update(
        accept_content=["json", "pickle"],
        task_serializer="json",
        result_serializer="json",
        event_serializer="json",
    )
    try:
        checks = run_checks(Settings.from_env(env), app=app, local_specs=[])
    finally:
        app.close()

    assert failing(checks) == ["json-only"]
    assert "accept_content=['json', 'pickle']" in by_name(checks)["json-only"].message


def test_a_broker_beyond_this_machine_needs_tls_or_a_password_and_signing(
    admin: redis.Redis, env: dict[str, str], server: RedisServer
) -> None:
    remote = {
        **env,
        "TOOLEXEC_BROKER_URL": "redis://redis.internal.example:6379/0",
        "TOOLEXEC_REDIS_URL": server.url,
    }

    open_broker = run_checks(Settings.from_env(remote))
    secured = run_checks(
        Settings.from_env(
            {
                **remote,
                "TOOLEXEC_BROKER_URL": "rediss://toolexec:s3cret@redis.internal.example:6380/0?ssl_cert_reqs=required",
                "TOOLEXEC_SIGNING_KEY": "k" * 32,
            }
        )
    )

    assert failing(open_broker) == ["transport-security", "signing"]
    assert "redis.internal.example" in by_name(open_broker)["transport-security"].message
    assert failing(secured) == []
    assert all("s3cret" not in check.message for check in secured)


def test_a_rabbitmq_broker_beyond_this_machine_needs_a_user_other_than_guest(
    admin: redis.Redis, env: dict[str, str], server: RedisServer
) -> None:
    signed = {**env, "TOOLEXEC_SIGNING_KEY": "k" * 32, "TOOLEXEC_REDIS_URL": server.url}

    guest = by_name(
        run_checks(
            Settings.from_env({**signed, "TOOLEXEC_BROKER_URL": "amqp://rabbit.internal.example//"})
        )
    )
    own_user = run_checks(
        Settings.from_env(
            {
                **signed,
                "TOOLEXEC_BROKER_URL": "amqps://toolexec:s3cret@rabbit.internal.example:5671//",
            }
        )
    )

    assert not guest["transport-security"].ok
    assert "rabbit.internal.example" in guest["transport-security"].message
    assert "guest account" in guest["transport-security"].message
    assert "amqps://" in guest["transport-security"].fix
    assert failing(own_user) == []


def test_an_unreachable_redis_fails_the_checks_that_read_it(
    env: dict[str, str], tmp_path: Path, closed_port: int
) -> None:
    url = f"redis://127.0.0.1:{closed_port}/0"
    checks = run_checks(
        Settings.from_env({**env, "TOOLEXEC_BROKER_URL": url, "TOOLEXEC_REDIS_URL": url})
    )

    assert failing(checks) == ["ttls", "persistence", "eviction", "same-tools-per-queue"]
    assert "cannot read Redis" in by_name(checks)["ttls"].message
    assert "cannot read the live workers" in by_name(checks)["same-tools-per-queue"].message


def test_replica_acks_that_no_replica_can_give_fail_naming_the_count_and_the_fix(
    admin: redis.Redis, env: dict[str, str]
) -> None:
    checks = by_name(run_checks(Settings.from_env({**env, "TOOLEXEC_REPLICA_ACKS": "1"})))

    assert failing(list(checks.values())) == ["replica-acks"]
    check = checks["replica-acks"]
    assert "has 0 replica(s) online; TOOLEXEC_REPLICA_ACKS=1" in check.message
    assert "none runs" in check.message and "attach 1 more replica(s)" in check.fix
