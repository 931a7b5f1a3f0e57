"""Deadlines hold with a worker's clock seconds ahead or behind (libfaketime).

Each test starts one concurrency-1 worker on the ``single`` queue with libfaketime
preloaded (the ``libfaketime`` wheel's library, as Debian's ``faketime -f`` would run
it), 5 s ahead of or 30 s behind this process and the Redis server, on each pool: prefork,
solo, threads and toolexec's asyncio pool.
Client and worker agree on time through Redis' ``TIME`` (``wire.clock``): a worker
ahead runs calls with seconds left, past both Celery's own expiry check (in its main
process, on its local clock) and the task's; a worker behind sheds a call whose
deadline passed while it was queued.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from pydantic import ValidationError

from agent_client import ToolClient, remote_tool
from agent_client.prepare import PreparedCall, prepare_call
from agent_client.validation import ArgumentValidator
from toolexec import ChildProcess, Pool, celery_worker_argv
from toolexec.worker_process import pool_env
from wire import keys
from wire.clock import shared_now
from wire.formats import parse_frame
from wire.models import CallOutcome, ErrorKind, WorkerInfo

from .conftest import PROJECT_ROOT
from .polling import wait_until

pytestmark = pytest.mark.integration

QUEUE = "single"
SKEW = 5.0
# Behind by more: the test shows the skew only if the worker takes the late call before
# its deadline has passed on the worker's own clock too. Two holds of 0.5 s came to 5.5 s
# on a CI machine at full load (xdist, mypy beside it); 30 s leaves that a wide margin.
BEHIND = 30.0


@pytest.fixture(scope="session")
def faketime_library() -> Path:
    """libfaketime's preload library, from the ``libfaketime`` wheel (the test extra).

    The test fails (never skips) if the wheel is missing. Found without importing the
    package, which would import dateutil and pytz for nothing.
    """
    spec = importlib.util.find_spec("libfaketime")
    locations = spec.submodule_search_locations if spec is not None else None
    for location in locations or []:
        library = Path(location, "vendor", "libfaketime", "src", "libfaketime.so.1")
        if library.is_file():
            return library
    pytest.fail(
        "the clock-skew tests need libfaketime's preload library from the libfaketime wheel: "
        "pip install -e '.[test]' (or pip install libfaketime)",
        pytrace=False,
    )


def skewed_env(library: Path, skew: float) -> dict[str, str]:
    """What ``faketime -f <skew>s`` adds to its command's environment, monotonic clock real.

    ``LD_PRELOAD`` and ``FAKETIME`` as the command sets them (without its shared memory,
    which the library then makes itself). ``FAKETIME_DONT_FAKE_MONOTONIC``: only the
    wall clock is off, as on a skewed host; libfaketime shifts the monotonic clock too
    by default. The wheel's library, unlike Debian 12's 0.9.10, then leaves the absolute
    ``clock_nanosleep`` behind ``time.sleep`` working, so Celery runs unchanged.
    """
    preload = os.pathsep.join(filter(None, [os.environ.get("LD_PRELOAD"), str(library)]))
    return {"LD_PRELOAD": preload, "FAKETIME": f"{skew:+g}s", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


class SkewedWorker:
    """A ``celery worker`` with its wall clock ``skew`` seconds off, stopped by PID."""

    def __init__(
        self, library: Path, *, skew: float, pool: Pool, env: dict[str, str], log_dir: Path
    ) -> None:
        self.name = f"skew{skew:+g}-{pool}-{uuid.uuid4().hex[:8]}"
        self.process = ChildProcess(
            self.name,
            celery_worker_argv(
                "executor", name=self.name, pool=pool, concurrency=1, queues=(QUEUE,)
            ),
            env={**os.environ, **pool_env(pool), **env, **skewed_env(library, skew)},
            cwd=PROJECT_ROOT,
            log_dir=log_dir,
        )
        self.info: WorkerInfo | None = None

    def start(self, client: redis.Redis, timeout: float = 30.0) -> WorkerInfo:
        """Start it (again) and return its heartbeat once it serves."""
        self.info = None
        self.process.start()
        ready = wait_until(
            lambda: self._heartbeat(client) is not None or not self.process.is_running, timeout
        )
        if not ready or self.info is None:
            raise AssertionError(
                f"worker {self.name} never published a heartbeat:\n{self.process.log_tail()}"
            )
        return self.info

    def _heartbeat(self, client: redis.Redis) -> WorkerInfo | None:
        for key in client.scan_iter(match=keys.worker("*"), count=500):
            raw = client.get(key)
            try:
                info = WorkerInfo.model_validate_json(raw) if raw is not None else None
            except ValidationError:
                continue
            if (
                info is not None
                and info.hostname.startswith(f"{self.name}@")
                and info.pid == self.process.pid
            ):
                self.info = info
                return info
        return None

    def stop(self) -> None:
        """SIGTERM the worker (it leaves the catalog), SIGKILL its group after 10 s."""
        pid = self.process.pid
        self.process.stop(timeout=10.0)
        # libfaketime keeps its state in shared memory named after the worker's PID and
        # removes it on a clean exit only; the faketime command would remove it here.
        if pid is not None:
            for name in (f"faketime_shm_{pid}", f"sem.faketime_sem_{pid}"):
                Path("/dev/shm", name).unlink(missing_ok=True)


@pytest.fixture
def skewed_worker(
    request: pytest.FixtureRequest,
    faketime_library: Path,
    probe_env: dict[str, str],
    redis_client: redis.Redis,
    tmp_path: Path,
) -> Iterator[SkewedWorker]:
    """The only consumer of ``single``: pool and skew from the test's parameters."""
    skew, pool = request.param
    worker = SkewedWorker(faketime_library, skew=skew, pool=pool, env=probe_env, log_dir=tmp_path)
    try:
        info = worker.start(redis_client)
        # The worker's clock really is off: its heartbeat's start time is on its clock.
        started_apart = info.started_at - time.time()
        assert started_apart == pytest.approx(skew, abs=2.0), (
            f"libfaketime did not skew the worker: it started {started_apart:+.1f} s apart"
        )
        yield worker
    finally:
        worker.stop()


POOLS: list[Pool] = ["prefork", "solo", "threads", "asyncio"]


@pytest.mark.parametrize(
    "skewed_worker", [(SKEW, pool) for pool in POOLS], ids=POOLS, indirect=True
)
def test_a_worker_five_seconds_ahead_runs_calls_with_three_second_deadlines(
    skewed_worker: SkewedWorker, tool_client: ToolClient, redis_client: redis.Redis
) -> None:
    # On its own clock every deadline has passed when the message arrives: Celery's
    # expiry check in the main process and the task's check would both drop it.
    counted = f"probe:skew-ahead:{uuid.uuid4().hex}"
    count = remote_tool("probe_count_single", timeout=3)

    sequential = [count(key=counted) for _ in range(5)]

    async def concurrent() -> list[int]:
        return list(await asyncio.gather(*(count.run(key=counted) for _ in range(5))))

    together = asyncio.run(concurrent())

    assert sequential == [1, 2, 3, 4, 5]
    assert sorted(together) == [6, 7, 8, 9, 10]
    assert int(redis_client.get(counted) or 0) == 10


def prepared(
    client: ToolClient, tool: str, arguments: dict[str, Any], *, timeout: float, reply_to: str
) -> PreparedCall:
    """The message the client writes for a call of ``tool``, replying to ``reply_to``."""
    spec = client.catalog.spec(tool)
    return prepare_call(
        spec,
        arguments,
        validator=ArgumentValidator(
            spec.name, spec.parameters, max_bytes=client.settings.max_argument_bytes
        ),
        settings=client.settings,
        call_id=f"{reply_to}-{uuid.uuid4().hex[:8]}",
        reply_to=reply_to,
        timeout=timeout,
        run_id=None,
        idempotency_key=None,
        origin="skew-test",
    )


@pytest.mark.parametrize(
    "skewed_worker", [(-BEHIND, pool) for pool in POOLS], ids=POOLS, indirect=True
)
def test_a_worker_thirty_seconds_behind_never_runs_a_call_whose_deadline_passed_while_it_was_queued(
    skewed_worker: SkewedWorker, tool_client: ToolClient, redis_client: redis.Redis
) -> None:
    run = uuid.uuid4().hex
    counted, control = (f"probe:skew-behind:{what}:{run}" for what in ("count", "control"))
    reply_to = f"skew-test-{run}"
    # Two calls that each hold the worker for 0.5 s (an async sleep cut at its hard
    # limit), then a 0.3 s call; pushed at once, as the client pushes them, so the
    # short call's deadline passes while it waits behind the others. Nobody waits for it.
    hold = [
        prepared(
            tool_client, "probe_async_hard_single", {"seconds": 5}, timeout=15, reply_to=reply_to
        )
        for _ in range(2)
    ]
    late = prepared(
        tool_client, "probe_count_single", {"key": counted}, timeout=0.3, reply_to=reply_to
    )
    deadline = late.request.deadline
    assert deadline is not None
    redis_client.lpush(QUEUE, *(call.envelope for call in [*hold, late]))  # taken first to last

    assert wait_until(lambda: shared_now() > deadline, timeout=5.0)
    # The second call still runs or waits, so the short one has not started.
    assert redis_client.llen(keys.reply(reply_to)) <= 1, "the worker reached the short call in time"
    outcomes: dict[str, CallOutcome] = {}
    while late.call_id not in outcomes:
        popped = redis_client.blpop([keys.reply(reply_to)], timeout=15)
        assert popped is not None, f"the worker answered only {sorted(outcomes)}"
        frame = popped[1]
        assert isinstance(frame, bytes)
        call_id, is_progress, body = parse_frame(frame)
        assert not is_progress
        outcomes[call_id] = CallOutcome.model_validate_json(body)
    answered = time.time()

    refusal = outcomes.pop(late.call_id).error
    assert refusal is not None and refusal.kind is ErrorKind.EXPIRED, refusal
    assert sorted(outcomes) == sorted(call.call_id for call in hold)
    assert all(o.error is not None and o.error.type == "ToolHardTimeout" for o in outcomes.values())
    # On the worker's own clock the deadline was still ahead when it took the call.
    assert answered - BEHIND < deadline, "the worker took the call too late to show the skew"
    assert remote_tool("probe_count_single", timeout=10)(key=control) == 1
    assert redis_client.get(counted) is None, "a call whose deadline had passed ran"
