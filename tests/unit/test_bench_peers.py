"""Scenario 11's arithmetic and settings: the peers' polls, the window, the idle, the goals.

No Redis and no worker here: the smoke run (tests/integration/test_bench_smoke.py)
runs the scenario itself.
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from bench.peers import arq_app, dramatiq_app, taskiq_app
from bench.peers.calls import Kind, result_poll
from bench.peers.tables import goals
from bench.peers.usage import Reading, Usage
from bench.stats import keep_window

ROOT = Path(__file__).resolve().parents[2]

#: The peers and the packages the bench extra pins for them.
PEER_PACKAGES = ("dramatiq", "arq", "taskiq", "taskiq-redis")


def test_a_polling_peer_polls_every_millisecond_alone_and_slower_with_more_in_flight() -> None:
    assert result_poll(1) == result_poll(4) == pytest.approx(0.001)
    assert result_poll(10) == pytest.approx(0.0025)
    assert result_poll(100) == pytest.approx(0.025)
    assert result_poll(1000) == result_poll(100_000) == pytest.approx(0.2)  # taskiq's default


def test_the_window_keeps_at_most_n_calls_outstanding_and_waits_for_the_oldest_first() -> None:
    outstanding: list[int] = []
    waited: list[int] = []
    most = 0
    sent = iter(range(1000))

    def send() -> int:
        nonlocal most
        handle = next(sent)
        outstanding.append(handle)
        most = max(most, len(outstanding))
        return handle

    def wait(handle: int) -> None:
        assert outstanding[0] == handle
        outstanding.pop(0)
        waited.append(handle)

    keep_window(send, wait, 7, 50)

    assert waited == list(range(50))
    assert most == 7
    assert outstanding == []


def _reading(cpu: float, commands: int) -> Reading:
    return Reading(main=cpu, children=2 * cpu, client=3 * cpu, redis=4 * cpu, commands=commands)


def test_usage_charges_the_worker_whole_and_the_shared_processes_above_idle() -> None:
    idle = Usage()
    idle.add(_reading(0.0, 0), _reading(0.01, 20), seconds=1.0, calls=0)  # per second
    busy = Usage()
    busy.add(_reading(0.0, 0), _reading(1.0, 1000), seconds=2.0, calls=100)

    net = busy.net(idle)

    assert (net.main, net.children) == (1.0, 2.0)  # its heartbeats and polls are its cost
    assert net.client == pytest.approx(3.0 - 0.06)
    assert net.redis == pytest.approx(4.0 - 0.08)
    assert net.per_call(net.commands) == pytest.approx((1000 - 40) / 100)
    assert net.cpu == pytest.approx(10.0 - 0.14)
    assert net.rate == pytest.approx(50.0)


def test_a_block_read_after_it_ended_has_its_rate_from_its_calls_and_idle_over_the_reading() -> (
    None
):
    idle = Usage()
    idle.add(_reading(0.0, 0), _reading(0.01, 20), seconds=1.0, calls=0)  # per second
    busy = Usage()
    # 100 calls took 2 s; their trailing writes were waited for, and read 3 s after the start.
    busy.add(_reading(0.0, 0), _reading(1.0, 1000), seconds=2.0, calls=100, span=3.0)

    net = busy.net(idle)

    assert net.rate == pytest.approx(50.0)  # the calls' time, not the wait's
    assert net.client == pytest.approx(3.0 - 0.09)  # idle over all 3 s
    assert net.redis == pytest.approx(4.0 - 0.12)
    assert net.commands == pytest.approx(1000 - 60)
    # The worker is charged whole for the block's 2 s, less its idle rate after them.
    assert (net.main, net.children) == (pytest.approx(1.0 - 0.01), pytest.approx(2.0 - 0.02))


def test_usage_never_goes_below_zero_when_a_block_spent_less_than_idle() -> None:
    idle = Usage()
    idle.add(_reading(0.0, 0), _reading(1.0, 1000), seconds=1.0, calls=0)
    busy = Usage()
    busy.add(_reading(0.0, 0), _reading(0.1, 10), seconds=1.0, calls=10)

    net = busy.net(idle)

    assert (net.client, net.redis, net.commands) == (0, 0, 0)


KINDS: dict[str, Kind] = {
    "toolexec (prefork -c 2)": "toolexec",
    "toolexec (asyncio -c 100)": "toolexec",
    "raw Celery (prefork -c 2)": "raw",
    "Dramatiq": "peer",
    "arq": "peer",
    "taskiq": "peer",
    "floor": "floor",
}


def _by_side(*values: float) -> dict[str, float]:
    return dict(zip(KINDS, values, strict=True))


def test_the_goals_compare_toolexecs_best_pool_with_the_fastest_and_the_leanest_peer() -> None:
    rates = {
        100: _by_side(900, 1300, 400, 1000, 800, 600, 5000),  # asyncio 1.30x Dramatiq: PASS
        1000: _by_side(900, 1200, 400, 1000, 800, 600, 5000),  # 1.20x: MISS
    }
    cpu = {  # seconds per call; the leanest toolexec pool is 0.8 ms
        100: _by_side(1.0e-3, 0.8e-3, 2e-3, 1.0e-3, 1.2e-3, 1.5e-3, 0.4e-3),  # 0.80x, 2.0x floor
        1000: _by_side(1.0e-3, 0.9e-3, 2e-3, 1.0e-3, 1.2e-3, 1.5e-3, 0.3e-3),  # 0.90x, 3.0x
    }
    p50 = _by_side(0.0014, 0.0016, 0.003, 0.004, 0.005, 0.006, 0.0003)

    found = {
        g.name: (g.measured, g.verdict) for g in goals(kinds=KINDS, p50=p50, rates=rates, cpu=cpu)
    }

    assert found == {
        "toolexec's best pool / fastest peer, calls/s at 100 in flight": ("1.30×", "PASS"),
        "toolexec's best pool / leanest peer, CPU per call at 100 in flight": ("0.80×", "PASS"),
        "toolexec's best pool / RPC floor, CPU per call at 100 in flight": ("2.00×", "PASS"),
        "toolexec's best pool / fastest peer, calls/s at 1,000 in flight": ("1.20×", "MISS"),
        "toolexec's best pool / leanest peer, CPU per call at 1,000 in flight": ("0.90×", "MISS"),
        "toolexec's best pool / RPC floor, CPU per call at 1,000 in flight": ("3.00×", "MISS"),
        "toolexec (prefork -c 2) sequential p50 / raw Celery p50": ("0.47×", "PASS"),
        "toolexec (asyncio -c 100) sequential p50 / raw Celery p50": ("0.53×", "MISS"),
    }


def test_a_goal_level_the_run_did_not_measure_is_not_applicable() -> None:
    rates = {100: _by_side(900, 1300, 400, 1000, 800, 600, 5000)}
    cpu = {100: _by_side(1.0e-3, 0.8e-3, 2e-3, 1.0e-3, 1.2e-3, 1.5e-3, 0.4e-3)}
    p50 = _by_side(0.0014, 0.0016, 0.003, 0.004, 0.005, 0.006, 0.0003)

    at_1000 = [g for g in goals(kinds=KINDS, p50=p50, rates=rates, cpu=cpu) if "1,000" in g.name]

    assert len(at_1000) == 3
    assert {(g.measured, g.verdict) for g in at_1000} == {("not run", "n/a")}


def test_the_bench_extra_pins_each_peer_to_the_version_installed() -> None:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["bench"]
    pins = {}
    for requirement in extra:
        match = re.fullmatch(r"([A-Za-z0-9_-]+)(\[[^]]*\])?==([0-9.]+)", requirement)
        if match:
            pins[match.group(1)] = match.group(3)

    assert set(pins) == set(PEER_PACKAGES)
    assert {name: metadata.version(name) for name in PEER_PACKAGES} == pins


def test_each_peers_worker_runs_with_the_settings_the_output_states() -> None:
    dramatiq = dramatiq_app.worker_argv()
    taskiq = taskiq_app.worker_argv()

    assert dramatiq[dramatiq.index("--processes") + 1] == str(dramatiq_app.PROCESSES) == "2"
    assert dramatiq[dramatiq.index("--threads") + 1] == str(dramatiq_app.THREADS) == "8"
    assert taskiq[taskiq.index("--workers") + 1] == str(taskiq_app.WORKERS)
    assert taskiq[taskiq.index("--max-async-tasks") + 1] == str(taskiq_app.MAX_ASYNC_TASKS)
    assert taskiq[taskiq.index("--log-level") + 1] == "WARNING"
    assert arq_app.worker_settings("redis://127.0.0.1:1/0")["max_jobs"] == arq_app.MAX_JOBS
    for label, worker, client in (d.describe() for d in (dramatiq_app, arq_app, taskiq_app)):
        assert label.split()[1] == metadata.version(label.split()[0].lower())
        assert worker and client
    assert "--processes 2 --threads 8" in dramatiq_app.describe()[1]
    assert "poll_delay 5 ms" in arq_app.describe()[1]
    assert "25 ms at 100, 200 ms at 1,000" in arq_app.describe()[2]
    assert "--workers 2 --max-async-tasks 100" in taskiq_app.describe()[1]
