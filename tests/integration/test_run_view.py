"""The run view: each call's life in its run's log, served by ``toolexec ui``, seen in Chromium.

A Redis of the module's own, a real worker of each pool serving ``run_view_tools.py``, a
real ``toolexec ui`` process, and this process's client. The JSON API is read over HTTP;
the pages are driven in Debian's Chromium through Playwright (installed by the test
setup when missing, ``ui_support.chromium``).
"""

from __future__ import annotations

import collections
import math
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from playwright.sync_api import Page, expect, sync_playwright

from agent_client import ToolClient, ToolExecutionError, ToolTimeoutError, remote_tool, run_scope
from agent_client._io.runlog import FLUSH_GAP, REFRESH_GAP
from tests.integration.conftest import PROJECT_ROOT, stop_quickly
from tests.integration.polling import wait_until
from tests.integration.ui_support import UiServer, chromium, ui_server
from tests.redis_stats import commands
from toolexec.redis_server import RedisServer
from toolexec.ui.runs import RunReader
from toolexec.worker_process import Pool, WorkerProcess
from wire import keys
from wire.settings import Settings

pytestmark = pytest.mark.integration

MODULES = "tests.integration.run_view_tools"
QUEUE = "runview"
POOLS: list[Pool] = ["prefork", "asyncio"]
#: Where a run of the browser test leaves its screenshot (the README's picture) when set.
SCREENSHOT_DIR = os.environ.get("TOOLEXEC_SCREENSHOT_DIR")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(directory=tmp_path_factory.mktemp("runview-redis")) as redis_server:
        yield redis_server


@pytest.fixture(scope="module")
def env(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {
        "TOOLEXEC_BROKER_URL": server.url,
        "TOOLEXEC_REDIS_URL": server.url,
        "TOOLEXEC_DATA_DIR": str(tmp_path_factory.mktemp("runview-data")),
        "TOOLEXEC_HEARTBEAT_INTERVAL": "1",
        "TOOLEXEC_TOOL_MODULES": MODULES,
    }


@pytest.fixture(scope="module", params=POOLS)
def worker(
    request: pytest.FixtureRequest, env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    pool: Pool = request.param
    process = WorkerProcess(
        name=f"runview-{pool}-{uuid.uuid4().hex[:6]}",
        pool=pool,
        concurrency=4,
        queues=(QUEUE,),
        env=env,
        cwd=PROJECT_ROOT,
        log_dir=tmp_path_factory.mktemp("runview-workers"),
    )
    process.start(wait=True, timeout=60)
    yield process
    stop_quickly(process)


@pytest.fixture(scope="module")
def client(env: dict[str, str], worker: WorkerProcess) -> Iterator[ToolClient]:
    tool_client = ToolClient(Settings.from_env(env))
    yield tool_client
    tool_client.close()


@pytest.fixture(scope="module")
def ui(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiServer]:
    with ui_server(env, tmp_path_factory.mktemp("runview-ui")) as served:
        yield served


@pytest.fixture(scope="module")
def store(server: RedisServer) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(server.url) as connection:
        yield connection


@pytest.fixture(scope="module")
def page() -> Iterator[Page]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(chromium()), args=["--no-sandbox"])
        try:
            yield browser.new_page(viewport={"width": 1280, "height": 520})
        finally:
            browser.close()


def _run_of_five(client: ToolClient, run_id: str, counter: str) -> None:
    """One run: an ok call, an error, a timeout, and an idempotent call made twice."""
    with run_scope(run_id):
        assert remote_tool("rv_double", client=client).invoke_sync({"x": 21}) == 42
        with pytest.raises(ToolExecutionError):
            remote_tool("rv_fail", client=client).invoke_sync({"message": "no seats"})
        with pytest.raises(ToolTimeoutError):
            remote_tool("rv_sleep", client=client).invoke_sync({"seconds": 1.5}, timeout=0.4)
        book = remote_tool("rv_book", client=client)
        first = book.invoke_sync({"seat": "1A", "counter": counter})
        again = book.invoke_sync({"seat": "1A", "counter": counter})
        assert first == again == {"seat": "1A", "runs": 1}


def _calls(ui: UiServer, run_id: str) -> list[dict[str, Any]]:
    answer = ui.get(f"/api/runs/{run_id}")
    return answer.json()["calls"] if answer.status_code == 200 else []


def _settled(ui: UiServer, run_id: str, count: int) -> list[dict[str, Any]]:
    """The run's calls once ``count`` are logged, none live, and the timed-out call's run
    has ended on its worker."""
    found: list[list[dict[str, Any]]] = []

    def settled() -> bool:
        calls = _calls(ui, run_id)
        found[:] = [calls]
        return (
            len(calls) == count
            and all(c["status"] not in ("queued", "running") for c in calls)
            and all(c["ran_until"] is not None for c in calls if c["status"] == "timeout")
        )

    assert wait_until(settled, timeout=20), found
    return found[0]


# -- the JSON API --------------------------------------------------------------------------


def test_a_run_of_five_calls_is_served_with_each_calls_life(
    client: ToolClient, worker: WorkerProcess, ui: UiServer, store: redis.Redis
) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    counter = f"count-{run_id}"
    _run_of_five(client, run_id, counter)
    calls = _settled(ui, run_id, 5)

    assert [c["tool"] for c in calls] == ["rv_double", "rv_fail", "rv_sleep", "rv_book", "rv_book"]
    assert [c["status"] for c in calls] == ["ok", "error", "timeout", "ok", "ok"]
    ok, error, timeout, booked, repeat = calls
    assert (error["error_kind"], error["error_type"]) == ("execution", "ValueError")
    assert timeout["error_type"] == "ToolTimeoutError"
    # Its caller's end is its deadline, 0.4 s after it was sent (two readings of the shared
    # clock, each side's estimate of Redis' TIME, a few ms apart at most).
    assert abs(timeout["ended_at"] - timeout["deadline"]) <= 25
    assert abs(timeout["deadline"] - timeout["sent_at"] - 400) <= 25
    assert timeout["ran_until"] - timeout["started_at"] >= 1500  # the tool slept on, 1.5 s
    for call in (ok, error, timeout, booked):
        assert call["sent_at"] <= call["started_at"] <= call["ended_at"], call
        assert call["worker"].startswith(worker.name), call
        assert call["pool"] == worker.pool, call
        assert call["attempts"] == 1
        assert call["queue"] == QUEUE
        assert call["joined"] is False
    assert repeat["joined"] is True and repeat["worker"] is None and repeat["started_at"] is None
    assert int(store.get(counter) or 0) == 1  # the repeat ran nothing
    for call in calls:
        assert set(call) >= {
            "call_id",
            "tool",
            "status",
            "sent_at",
            "started_at",
            "ended_at",
            "worker",
            "attempts",
            "joined",
            "error_kind",
        }
    assert len({c["call_id"] for c in calls}) == 5

    runs = {r["run_id"]: r for r in ui.get("/api/runs").json()["runs"]}
    assert runs[run_id]["calls"] == 5
    assert runs[run_id]["failures"] == 2
    assert runs[run_id]["live"] == 0
    assert runs[run_id]["time_spent"] >= 400


def test_retries_and_the_progress_of_a_running_call_are_logged(
    client: ToolClient, ui: UiServer
) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    with run_scope(run_id):
        flaky = remote_tool("rv_flaky", client=client)
        assert flaky.invoke_sync({"counter": f"flaky-{run_id}", "fail_times": 2}) == 3
        handle = remote_tool("rv_steps", client=client).submit({"steps": 40, "pause": 0.1})

    seen: list[float] = []

    def progress_moved() -> bool:
        steps = [c for c in _calls(ui, run_id) if c["tool"] == "rv_steps"]
        if steps and steps[0]["status"] == "running" and steps[0]["progress"]:
            done = steps[0]["progress"]["done"]
            if not seen or done > seen[-1]:
                seen.append(done)
        return len(seen) >= 3

    assert wait_until(progress_moved, timeout=15), seen
    assert handle.result_sync(timeout=30) == 40
    calls = _settled(ui, run_id, 2)
    assert calls[0]["attempts"] == 3 and calls[0]["status"] == "ok"
    assert calls[1]["status"] == "ok" and calls[1]["progress"]["total"] == 40


def test_the_run_log_costs_one_xadd_per_call_on_each_side(
    client: ToolClient, ui: UiServer, store: redis.Redis
) -> None:
    """Redis' own count: a plain call adds one XADD from the client (sent) and one from the
    worker (ended, its start in it); the client sets the log's TTL once a flush (at most
    one every ``FLUSH_GAP``), and writes the run's place in the index, and prunes it, at
    most once a second (``REFRESH_GAP``), however many calls."""
    run_id, calls = f"run-{uuid.uuid4().hex[:8]}", 20
    double = remote_tool("rv_double", client=client)
    with run_scope(run_id):
        double.invoke_sync({"x": 0})  # the run's log exists before the block
        assert wait_until(lambda: len(_calls(ui, run_id)) == 1 and _ended(store, run_id) == 1)
        before, began = commands(store), time.monotonic()
        for x in range(calls):
            assert double.invoke_sync({"x": x}) == 2 * x
        assert wait_until(lambda: _ended(store, run_id) == calls + 1, timeout=10)
        added, took = commands(store) - before, time.monotonic() - began
    assert added["xadd"] == 2 * calls
    refreshes = math.floor(took / REFRESH_GAP) + 1  # at most, in a block of ``took`` seconds
    assert added["zadd"] <= refreshes and added["zremrangebyscore"] <= refreshes, (added, took)
    flushes = math.floor(took / FLUSH_GAP) + 2  # at most: one per gap, and the block's last
    assert added["pexpire"] <= flushes + refreshes, (added, took)
    kinds = collections.Counter(
        fields[b"e"].decode() for _, fields in store.xrange(keys.run_log(run_id))
    )
    assert kinds == {"sent": calls + 1, "ended": calls + 1}


def test_closing_a_client_sends_the_events_it_holds(
    env: dict[str, str], worker: WorkerProcess, store: redis.Redis
) -> None:
    # A keyed call's answer is logged a moment after its send's flush: within FLUSH_GAP,
    # so that flush waits, and the close must send it rather than wait or drop it. A
    # client used again after a close (a new I/O loop) does the same at its next close.
    closing = ToolClient(Settings.from_env(env))
    for _ in range(2):
        run_id, counter = f"run-{uuid.uuid4().hex[:8]}", f"runview:{uuid.uuid4().hex}"
        with run_scope(run_id):
            assert remote_tool("rv_book", client=closing).invoke_sync(
                {"seat": "9Z", "counter": counter}
            ) == {"seat": "9Z", "runs": 1}
        closing.close()
        kinds = {fields[b"e"].decode() for _, fields in store.xrange(keys.run_log(run_id))}
        assert {"sent", "answered"} <= kinds, kinds
        assert store.pttl(keys.run_log(run_id)) > 0


def _ended(store: redis.Redis, run_id: str) -> int:
    return sum(1 for _, f in store.xrange(keys.run_log(run_id)) if f[b"e"] == b"ended")


def test_a_call_outside_any_run_is_logged_under_its_client(
    client: ToolClient, ui: UiServer
) -> None:
    assert remote_tool("rv_double", client=client).invoke_sync({"x": 1}) == 2
    run_id = f"client-{client.client_id}"
    assert wait_until(lambda: any(c["status"] == "ok" for c in _calls(ui, run_id)), timeout=10)
    assert run_id in {r["run_id"] for r in ui.get("/api/runs").json()["runs"]}


def test_arguments_and_results_stay_out_of_the_log_unless_the_tool_opts_in(
    client: ToolClient, ui: UiServer, store: redis.Redis
) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    secret, shared = f"secret-{uuid.uuid4().hex}", f"shared-{uuid.uuid4().hex}"
    with run_scope(run_id):
        with pytest.raises(ToolExecutionError):
            remote_tool("rv_fail", client=client).invoke_sync({"message": secret})
        assert remote_tool("rv_logged", client=client).invoke_sync({"text": shared}) == {
            "echo": shared
        }
    calls = _settled(ui, run_id, 2)
    assert calls[0]["arguments"] is None and calls[0]["result"] is None
    assert calls[1]["arguments"] == {"text": shared}
    assert calls[1]["result"] == {"echo": shared}
    logged = repr(store.xrange(keys.run_log(run_id)))
    assert secret not in logged and shared in logged
    assert store.pttl(keys.run_log(run_id)) > 0


def test_an_unknown_run_is_a_404_that_says_so(ui: UiServer) -> None:
    answer = ui.get("/api/runs/no-such-run")
    assert answer.status_code == 404
    assert "no-such-run" in answer.json()["error"]
    assert ui.get("/runs/no-such-run").status_code == 404


def test_the_fleet_lists_the_live_worker_and_its_queue(worker: WorkerProcess, ui: UiServer) -> None:
    fleet = ui.get("/api/fleet").json()
    assert any(w["worker_id"].startswith(worker.name) for w in fleet["workers"])
    assert QUEUE in fleet["queues"]


# -- in the browser ------------------------------------------------------------------------


def test_the_run_page_shows_each_call_as_a_bar_with_its_outcome(
    client: ToolClient, worker: WorkerProcess, ui: UiServer, page: Page
) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    _run_of_five(client, run_id, f"count-{run_id}")
    calls = _settled(ui, run_id, 5)

    page.goto(f"{ui.url}/runs/{run_id}")
    rows = page.locator(".call")
    expect(rows).to_have_count(5)
    for row, call in zip(rows.all(), calls, strict=True):
        expect(row).to_have_attribute("data-call-id", call["call_id"])
        expect(row).to_have_attribute("data-status", call["status"])
        expect(row.locator(".status")).to_have_text(call["status"])
        expect(row.locator(".tool")).to_have_text(call["tool"])
    ok, error, timeout, booked, repeat = rows.all()
    expect(ok.locator(".bar-run.s-ok")).to_have_count(1)
    expect(error.locator(".bar-run.s-error")).to_have_count(1)
    expect(error.locator(".mark")).to_contain_text("ValueError")
    expect(timeout.locator(".bar-run.s-timeout")).to_have_count(1)
    expect(timeout.locator(".bar-late")).to_have_count(1)
    expect(timeout.locator(".mark")).to_contain_text("ToolTimeoutError")
    expect(booked.locator(".bar-run.s-ok")).to_have_count(1)
    expect(repeat.locator(".bar-run")).to_have_count(0)
    expect(repeat.locator(".m-joined")).to_have_count(1)
    # The box of each part as drawn, both read in one script: the page redraws its
    # timeline live, and a part found before a redraw is detached after it (no box).
    late, ran = page.evaluate(
        """id => {
            const row = document.querySelector(`.call[data-call-id="${id}"]`);
            return [".bar-late", ".bar-run"].map(
                part => row.querySelector(part).getBoundingClientRect().toJSON());
        }""",
        calls[2]["call_id"],
    )
    assert late["width"] > 0 and late["x"] >= ran["x"] + ran["width"] - 1, (late, ran)
    if SCREENSHOT_DIR and worker.pool == "asyncio":
        page.screenshot(path=str(Path(SCREENSHOT_DIR) / "run-view.png"), full_page=True)

    page.goto(ui.url + "/")
    expect(page.locator(f'tr[data-run-id="{run_id}"]')).to_contain_text("5")
    expect(page.locator("#fleet")).to_contain_text(worker.name)


def test_a_live_calls_progress_moves_on_the_page(
    client: ToolClient, ui: UiServer, page: Page
) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    # Opened before its run has logged anything: the page says so, and shows the call
    # once it is logged.
    opened = page.goto(f"{ui.url}/runs/{run_id}")
    assert opened is not None and opened.status == 404
    expect(page.locator("#timeline")).to_contain_text(f"no run '{run_id}' is logged")
    with run_scope(run_id):
        handle = remote_tool("rv_steps", client=client).submit({"steps": 50, "pause": 0.1})
    row = page.locator(f'.call[data-call-id="{handle.id}"]')
    expect(row).to_have_attribute("data-status", "running", timeout=10_000)
    expect(row).to_have_attribute("data-progress", re.compile(r"\d"))
    first = float(row.get_attribute("data-progress") or 0)
    page.wait_for_function(
        '([id, first]) => Number(document.querySelector(`.call[data-call-id="${id}"]`)'
        "?.dataset.progress) > first + 5",
        arg=[handle.id, first],
        timeout=10_000,
    )
    expect(row.locator(".m-progress")).to_contain_text("/50")
    assert handle.result_sync(timeout=30) == 50
    expect(page.locator(f'.call[data-call-id="{handle.id}"]')).to_have_attribute(
        "data-status", "ok", timeout=10_000
    )


# -- access ----------------------------------------------------------------------------------


def test_a_token_guards_every_request_when_set(
    env: dict[str, str], tmp_path: Path, worker: WorkerProcess
) -> None:
    token = uuid.uuid4().hex
    with ui_server({**env, "TOOLEXEC_UI_TOKEN": token}, tmp_path) as guarded:
        refused = guarded.get("/api/runs")
        assert refused.status_code == 401
        assert "TOOLEXEC_UI_TOKEN" in refused.text
        assert guarded.get("/api/runs", headers={"Authorization": "Bearer nope"}).status_code == 401
        bearer = guarded.get("/api/runs", headers={"Authorization": f"Bearer {token}"})
        assert bearer.status_code == 200 and "runs" in bearer.json()
        with httpx.Client(base_url=guarded.url, timeout=10.0) as browser:
            assert browser.get("/", params={"token": token}).status_code == 200
            assert browser.get("/api/fleet").status_code == 200  # the cookie carries it now


def test_it_will_not_serve_off_loopback_without_a_token(env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "toolexec", "ui", "--host", "0.0.0.0", "--port", "1"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "TOOLEXEC_UI_TOKEN" in done.stderr and "0.0.0.0" in done.stderr


# -- a log that cannot be written ------------------------------------------------------------


def test_calls_go_on_when_redis_refuses_the_run_log(tmp_path: Path) -> None:
    """The documented ACL without the run log's commands: calls are answered as ever, the
    worker says what Redis refused, and nothing of the log is written."""
    from tests.integration.test_tls_acl import documented_acl

    password = uuid.uuid4().hex
    lines = []
    for line in documented_acl():
        if line.startswith("user toolexec "):
            line = line.replace(">CHANGE-ME", f">{password}").replace(" ~default* ", f" ~{QUEUE}* ")
            for command in (" +xadd", " +xrange", " +zrevrange"):
                assert command in line
                line = line.replace(command, "")
        lines.append(line)
    admin_password = uuid.uuid4().hex
    lines.append(f"user admin on >{admin_password} ~* &* +@all")
    acl = tmp_path / "users.acl"
    acl.write_text("\n".join(lines) + "\n")
    with RedisServer(
        directory=tmp_path / "redis", acl_file=acl, username="admin", password=admin_password
    ) as server:
        url = f"redis://toolexec:{password}@127.0.0.1:{server.port}/0"
        env = {
            "TOOLEXEC_BROKER_URL": url,
            "TOOLEXEC_REDIS_URL": url,
            "TOOLEXEC_DATA_DIR": str(tmp_path / "data"),
            "TOOLEXEC_HEARTBEAT_INTERVAL": "1",
            "TOOLEXEC_TOOL_MODULES": MODULES,
        }
        process = WorkerProcess(
            name=f"runview-acl-{uuid.uuid4().hex[:6]}",
            pool="asyncio",
            concurrency=4,
            queues=(QUEUE,),
            env=env,
            cwd=PROJECT_ROOT,
            log_dir=tmp_path / "worker",
        )
        process.start(wait=True, timeout=60)
        tool_client = ToolClient(Settings.from_env(env))
        try:
            with run_scope("refused-run"):
                double = remote_tool("rv_double", client=tool_client)
                assert [double.invoke_sync({"x": x}) for x in range(5)] == [0, 2, 4, 6, 8]
            assert wait_until(lambda: "run log: Redis refused" in process.log_tail(200), 10)
            with redis.Redis.from_url(server.url) as admin:
                assert admin.keys("toolexec:run:*") == []
        finally:
            tool_client.close()
            stop_quickly(process)


def test_a_call_sent_again_after_its_worker_died_says_so(tmp_path: Path) -> None:
    with RedisServer(directory=tmp_path / "redis") as own:
        env = {
            "TOOLEXEC_BROKER_URL": own.url,
            "TOOLEXEC_REDIS_URL": own.url,
            "TOOLEXEC_DATA_DIR": str(tmp_path / "data"),
            "TOOLEXEC_HEARTBEAT_INTERVAL": "1",
            "TOOLEXEC_TOOL_MODULES": MODULES,
        }

        def started(name: str) -> WorkerProcess:
            process = WorkerProcess(
                name=name,
                pool="asyncio",
                concurrency=2,
                queues=(QUEUE,),
                env=env,
                cwd=PROJECT_ROOT,
                log_dir=tmp_path / name,
            )
            return process.start(wait=True, timeout=60)

        first = started(f"runview-dies-{uuid.uuid4().hex[:6]}")
        tool_client = ToolClient(Settings.from_env(env))
        second: WorkerProcess | None = None
        try:
            with run_scope("resent-run"):
                handle = remote_tool("rv_slow_book", client=tool_client).submit(
                    {"seat": "2B", "seconds": 2.0}, timeout=60
                )
            with redis.Redis.from_url(own.url) as db:
                assert wait_until(
                    lambda: any(
                        f[b"e"] == b"started" for _, f in db.xrange(keys.run_log("resent-run"))
                    ),
                    timeout=10,
                )
                first.kill()
                second = started(f"runview-lives-{uuid.uuid4().hex[:6]}")
                assert handle.result_sync(timeout=60) == "2B"

                def ended() -> list[Any]:
                    calls = RunReader(db).run("resent-run") or []
                    return [c for c in calls if c.status == "ok"]

                assert wait_until(ended, timeout=10)
                (call,) = RunReader(db).run("resent-run") or []
            assert call.resent == 1
            assert call.worker is not None and call.worker.startswith(second.name)
        finally:
            tool_client.close()
            stop_quickly(first)
            if second is not None:
                stop_quickly(second)
