"""A worker that dies at any moment after taking a call: the call is never just lost.

The narrowest window: a worker takes a message off its queue and dies before its
heartbeat records that it holds the call (it does so every third of an interval). Then
nothing in Redis names the call: it is neither queued nor held. These tests open that
window for real: the worker is SIGKILLed (its whole process group) while it runs the
call, and the record its heartbeat may already have written is deleted, as if it had
died a moment earlier. The client's watchdog must notice within a few heartbeat
intervals, for calls with no deadline too, on every pool: ``WorkerLost`` for an
at-most-once call, a re-run elsewhere for an at-least-once one. And when no worker is
left to re-run it, an at-least-once call is sent again once and waits in its queue for
a worker, as any call sent while no worker serves its queue does, and runs once when a
worker comes.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
import redis

from agent_client import ToolClient, ToolOutcomeUnknown, WorkerLost, remote_tool
from agent_client.runs import idempotency_key
from toolexec import Pool, WorkerProcess
from wire import keys
from wire.formats import parse_state
from wire.settings import Settings

from .polling import wait_until

if TYPE_CHECKING:
    from .conftest import WorkerFactory

pytestmark = pytest.mark.integration

POOLS: list[Pool] = ["prefork", "threads", "solo", "asyncio"]


@pytest.fixture
def lost_env(probe_env: dict[str, str]) -> dict[str, str]:
    """The probe tools and the idempotent ones (``tests/integration/idem_tools.py``)."""
    return {
        **probe_env,
        "TOOLEXEC_TOOL_MODULES": probe_env["TOOLEXEC_TOOL_MODULES"]
        + ",tests.integration.idem_tools",
    }


@pytest.fixture
def client(lost_env: dict[str, str]) -> Iterator[ToolClient]:
    """A client of its own, so its call ids are easy to find in Redis."""
    client = ToolClient(Settings.from_env(lost_env))
    yield client
    client.close()


def _kill_before_its_first_heartbeat(
    worker: WorkerProcess, client: ToolClient, store: redis.Redis, *also: str
) -> None:
    """SIGKILL the whole worker, then erase what it recorded of the client's calls (and
    the keys in ``also``: an idempotent call's marker, written when it began)."""
    worker.kill()
    records = [*store.scan_iter(match=keys.running(f"{client.client_id}-*")), *also]
    if records:  # none when it died before its first heartbeat for real
        store.delete(*records)


@pytest.mark.parametrize("pool", POOLS)
def test_an_at_most_once_call_whose_worker_died_unrecorded_is_worker_lost_within_seconds(
    pool: Pool,
    worker_factory: WorkerFactory,
    lost_env: dict[str, str],
    client: ToolClient,
    redis_client: redis.Redis,
    settings: Settings,
) -> None:
    worker = worker_factory(pool=pool, concurrency=1, queues=("single",), env=lost_env)
    sleeper = remote_tool("probe_block_single", timeout=None, client=client)  # no deadline at all
    assert sleeper.spec.delivery == "at_most_once"
    marker = f"probetest:pid:{uuid.uuid4().hex}"

    with concurrent.futures.ThreadPoolExecutor(1) as threads:
        call = threads.submit(sleeper, seconds=60, marker=marker)
        assert wait_until(lambda: redis_client.exists(marker)), "the call never started"
        _kill_before_its_first_heartbeat(worker, client, redis_client)
        killed = time.monotonic()
        with pytest.raises(WorkerLost) as raised:
            call.result(timeout=30)
        heard = time.monotonic() - killed

    # Two intervals without a holder, then two looks an interval apart: a few intervals.
    assert heard < 6 * settings.heartbeat_interval, f"heard after {heard:.1f}s"
    assert "no live worker holds it" in str(raised.value)
    assert client.replies.pending == 0


@pytest.mark.parametrize("pool", POOLS)
def test_an_at_least_once_call_whose_worker_died_unrecorded_runs_again_on_another(
    pool: Pool,
    worker_factory: WorkerFactory,
    lost_env: dict[str, str],
    client: ToolClient,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = worker_factory(pool=pool, concurrency=1, queues=("idem_kill",), env=lost_env)
    slow = remote_tool("idem_slow_alo", timeout=None, client=client)
    assert slow.spec.delivery == "at_least_once"
    counter, marker = f"probetest:runs:{uuid.uuid4().hex}", f"probetest:pid:{uuid.uuid4().hex}"

    arguments = {"counter": counter, "seconds": 1.0, "marker": marker}
    run_id = uuid.uuid4().hex
    key = idempotency_key(run_id, slow.name, slow.parameters, arguments)

    # The watchdog's warning, whatever level an earlier test left the root logger at.
    with (
        concurrent.futures.ThreadPoolExecutor(1) as threads,
        caplog.at_level(logging.WARNING, logger="agent_client"),
    ):
        call = threads.submit(slow.invoke_sync, arguments, run_id=run_id)
        assert wait_until(lambda: redis_client.exists(marker)), "the call never started"
        _kill_before_its_first_heartbeat(first, client, redis_client, keys.state(key))
        worker_factory(pool=pool, concurrency=1, queues=("idem_kill",), env=lost_env)
        result = call.result(timeout=60)

    # The first run died with its worker; the watchdog sent the call again and the other
    # worker ran it: twice in all, as at-least-once allows, and the caller got it.
    assert result["runs"] == 2
    assert int(redis_client.get(counter) or 0) == 2
    assert "the call left its queue but no live worker holds it" in caplog.text
    assert client.replies.pending == 0


def test_an_at_least_once_call_whose_only_worker_died_waits_in_its_queue_and_runs_once_when_a_worker_comes(  # noqa: E501
    worker_factory: WorkerFactory,
    lost_env: dict[str, str],
    client: ToolClient,
    redis_client: redis.Redis,
    settings: Settings,
) -> None:
    redis_client.delete("idem_kill")
    only = worker_factory(pool="prefork", concurrency=1, queues=("idem_kill",), env=lost_env)
    slow = remote_tool("idem_slow_alo", timeout=60, client=client)
    counter, marker = f"probetest:runs:{uuid.uuid4().hex}", f"probetest:pid:{uuid.uuid4().hex}"
    arguments = {"counter": counter, "seconds": 1.0, "marker": marker}
    run_id = uuid.uuid4().hex
    key = idempotency_key(run_id, slow.name, slow.parameters, arguments)
    interval = settings.heartbeat_interval

    with concurrent.futures.ThreadPoolExecutor(1) as threads:
        call = threads.submit(slow.invoke_sync, arguments, run_id=run_id)
        assert wait_until(lambda: redis_client.exists(marker)), "the call never started"
        only.kill()  # the whole worker, with its heartbeat: no worker serves the queue
        # Its key's state names the dead worker: the watchdog sends it again once, then
        # finds that copy waiting in the queue, round after round, and leaves it there.
        assert wait_until(lambda: redis_client.llen("idem_kill") == 1, timeout=10 * interval)
        with pytest.raises(concurrent.futures.TimeoutError):
            call.result(timeout=8 * interval)  # the watchdog's looks: a duration, not a condition
        assert redis_client.llen("idem_kill") == 1  # sent again once, not once per look
        assert int(redis_client.get(counter) or 0) == 1
        # A worker that starts within the deadline runs the call once more, and the
        # caller, still waiting, gets its result.
        later = worker_factory(pool="prefork", concurrency=1, queues=("idem_kill",), env=lost_env)
        result = call.result(timeout=30)

    assert (
        result["runs"] == 2 and result["pid"] in later.child_pids()
    )  # the killed run, then this one
    assert redis_client.llen("idem_kill") == 0
    assert parse_state(redis_client.get(keys.state(key))).outcome is not None
    retried = slow.invoke_sync(arguments, run_id=run_id, timeout=10)
    assert retried["runs"] == 2 and retried["token"] == result["token"]  # the stored outcome
    assert int(redis_client.get(counter) or 0) == 2


def test_an_at_most_once_call_that_vanished_while_its_worker_lives_is_outcome_unknown_not_worker_lost(  # noqa: E501
    worker_factory: WorkerFactory,
    lost_env: dict[str, str],
    client: ToolClient,
    redis_client: redis.Redis,
    settings: Settings,
) -> None:
    # Redis can lose a message between its queue and a worker (a pop whose reply never
    # left a Redis that was killed). Here the message is taken off the queue by hand
    # while the only worker (solo: it takes nothing while it runs a call) is busy, and
    # that worker lives on: no worker died, so the caller must not hear WorkerLost.
    redis_client.delete("single")
    worker = worker_factory(pool="solo", concurrency=1, queues=("single",), env=lost_env)
    block = remote_tool("probe_block_single", timeout=30, client=client)
    echo = remote_tool("probe_echo_single", timeout=None, client=client)  # no deadline
    assert echo.spec.delivery == "at_most_once"
    marker = f"probetest:pid:{uuid.uuid4().hex}"

    with concurrent.futures.ThreadPoolExecutor(2) as threads:
        busy = threads.submit(block, seconds=6.0, marker=marker)
        assert wait_until(lambda: redis_client.exists(marker)), "the blocking call never started"
        lost = threads.submit(echo, text="vanishes", number=1)
        assert wait_until(lambda: redis_client.llen("single") == 1), "the call was never queued"
        (envelope,) = redis_client.lrange("single", 0, -1)
        assert redis_client.lrem("single", 1, envelope) == 1
        taken = time.monotonic()
        with pytest.raises(ToolOutcomeUnknown) as raised:
            lost.result(timeout=30)
        heard = time.monotonic() - taken
        assert busy.result(timeout=30)["slept"] == 6.0

    assert not isinstance(raised.value, WorkerLost)
    assert raised.value.timeout is None  # told before any deadline: it has none
    assert "no worker of its queue died" in str(raised.value) and "may or may not have run" in str(
        raised.value
    )
    assert heard < 6 * settings.heartbeat_interval, f"heard after {heard:.1f}s"
    assert worker.is_running
    assert client.replies.pending == 0
