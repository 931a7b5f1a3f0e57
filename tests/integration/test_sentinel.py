"""Redis that fails over: workers and clients on a group managed by Sentinels.

Each test starts a group of its own (``toolexec.redis_group.RedisSentinels``: a master, a
replica and three ``redis-server --sentinel`` processes, on free ports), names it in both
roles (``TOOLEXEC_BROKER_URL`` and ``TOOLEXEC_REDIS_URL`` are its ``sentinel://`` URL, with
``TOOLEXEC_SENTINEL_MASTER``), and runs real workers and a real client on it.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import pytest
import redis

from agent_client import RemoteToolError, ToolClient, remote_tool, run_scope
from toolexec import Pool
from toolexec.doctor.sentinels import sentinels
from toolexec.redis_group import RedisSentinels
from wire import keys
from wire.settings import Settings

from .polling import wait_until
from .replication_relay import RelayProcess
from .starvation import LoopWatch
from .tls_support import make_tls_files

if TYPE_CHECKING:
    from .conftest import WorkerFactory

pytestmark = pytest.mark.integration

TOOLS = "tests.integration.failover_tools"
#: Each call's deadline in the failover test, and how late past it a caller may hear.
TIMEOUT = 5.0
SLACK = 0.5
#: Calls started per second, for how long, and when the master is killed.
RATE = 60
SECONDS = 20.0
KILL_AT = 5.0
#: In the lossy failover: how long the replication stream is held back before the kill.
HELD = 1.0


def group_env(group: RedisSentinels, data: Path) -> dict[str, str]:
    """Settings naming ``group`` in both roles."""
    return {
        "TOOLEXEC_BROKER_URL": group.url,
        "TOOLEXEC_REDIS_URL": group.url,
        "TOOLEXEC_SENTINEL_MASTER": group.master_name,
        "TOOLEXEC_TOOL_MODULES": TOOLS,
        "TOOLEXEC_DATA_DIR": str(data),
    }


def runs(data: Path) -> collections.Counter[str]:
    """How many times each ``<tool> <key>`` ran (``failover_tools.RUNS``)."""
    path = data / "runs.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return collections.Counter(lines)


@pytest.mark.parametrize("pool", ["prefork", "asyncio"])
def test_workers_and_clients_reach_the_master_through_its_sentinels_in_both_roles(
    pool: Pool, tmp_path: Path, worker_factory: WorkerFactory
) -> None:
    with RedisSentinels(tmp_path / "group") as group:
        env = group_env(group, tmp_path / "data")
        worker_factory(pool=pool, concurrency=2, env=env)
        client = ToolClient(Settings.from_env(env))
        try:
            echo = remote_tool("failover_echo", timeout=10, client=client)
            book = remote_tool("failover_book", timeout=10, client=client)

            assert [echo(key=f"e{i}") for i in range(5)] == [f"e{i}" for i in range(5)]
            with run_scope():
                assert book(key="k1") == "k1"
                assert book(key="k1") == "k1"  # a repeat: the stored outcome, not a second run
        finally:
            client.close()
        assert group.master_port() == group.master.port
        with redis.Redis.from_url(group.master.url) as store:
            assert store.scard(keys.WORKERS) == 1  # the catalog is on the master
    assert runs(tmp_path / "data")["failover_book k1"] == 1
    assert sum(n for line, n in runs(tmp_path / "data").items() if "echo" in line) == 5


@dataclass(frozen=True)
class Ended:
    """One call of the load: what it was, when it started and ended, how."""

    tool: str
    key: str
    started: float
    ended: float
    outcome: str  # "ok", or the error's class name


@dataclass(frozen=True)
class Load:
    """What :func:`_load` saw: each call, when the master was killed and its successor
    known (seconds from the start), and the stalls of the test's own loop."""

    ended: list[Ended]
    killed_at: float
    known_at: float
    watch: LoopWatch


def _judged(label: str, load: Load, data: Path) -> tuple[str, list[str]]:
    """The load's report, checked against what every failover must keep: the load held,
    every call typed and ended within its deadline, calls after it succeed. Returns the
    report and the idempotent calls that ran twice.

    A call is late when it ended more than :data:`SLACK` past its deadline, less the time
    the machine kept the test's process off the CPU after that deadline
    (:class:`~tests.integration.starvation.LoopWatch`): no client hears a timer while its
    process is not run, and the suite runs six tests at once on two cores."""
    ended, killed_at, known_at = load.ended, load.killed_at, load.known_at
    by_kind = collections.Counter(call.outcome for call in ended)
    ran = runs(data)
    twice = sorted(k for k, n in ran.items() if k.startswith("failover_book ") and n > 1)
    oks = sorted(call.ended for call in ended if call.outcome == "ok")
    gap = max(b - a for a, b in itertools.pairwise(oks))
    after = [call for call in ended if call.started >= known_at]
    failed = [call.started for call in ended if call.outcome != "ok"]
    report = (
        f"{label}: {len(ended)} calls, outcomes {dict(by_kind)}; master killed at "
        f"{killed_at:.2f} s, new master known {known_at - killed_at:.2f} s later; longest gap "
        f"between successes {gap:.2f} s; {len(after)} calls sent after it, "
        f"{sum(c.outcome == 'ok' for c in after)} succeeded; idempotent calls run twice: "
        f"{len(twice)}; "
        + (
            f"the calls that failed were sent from {min(failed):.2f} s to {max(failed):.2f} s"
            if failed
            else "none failed"
        )
        + f"; {load.watch.summary()}"
    )
    print(report)

    assert len(ended) >= RATE * SECONDS * 0.9, report  # the load was at least ~50 calls/s
    typed = {kind for kind in by_kind if kind != "ok"}
    assert all(kind.endswith(_TYPED) for kind in typed), report
    late = [
        c
        for c in ended
        if c.ended - c.started - load.watch.starved_within(c.started + TIMEOUT, c.ended)
        > TIMEOUT + SLACK
    ]
    assert not late, f"{len(late)} calls ended past their deadline + {SLACK} s; {report}"
    assert sum(c.outcome == "ok" for c in after) >= 0.99 * len(after), report
    assert len(after) >= RATE * 5, report
    return report, twice


@pytest.mark.alone
@pytest.mark.parametrize("pool", ["prefork", "asyncio"])
def test_a_failover_under_load_ends_every_call_typed_within_its_deadline_and_calls_after_it_succeed(
    pool: Pool, tmp_path: Path, worker_factory: WorkerFactory
) -> None:
    data = tmp_path / "data"
    with RedisSentinels(tmp_path / "group") as group:
        env = group_env(group, data)
        worker_factory(pool=pool, concurrency=4 if pool == "prefork" else 20, env=env)
        client = ToolClient(Settings.from_env(env))
        try:
            echo = remote_tool("failover_echo", timeout=TIMEOUT, client=client)
            book = remote_tool("failover_book", timeout=TIMEOUT, client=client)
            assert echo(key="warm") == "warm" and book(key="warm") == "warm"
            load = asyncio.run(_load(group, echo, book))
        finally:
            client.close()

    _judged(pool, load, data)


@pytest.mark.alone
@pytest.mark.parametrize(("pool", "acks"), [("prefork", 0), ("prefork", 1), ("asyncio", 1)])
def test_a_lossy_failover_runs_no_idempotent_call_twice_with_replica_acks(
    pool: Pool, acks: int, tmp_path: Path, worker_factory: WorkerFactory
) -> None:
    # Two replicas replicate through a relay that holds their stream back for the last
    # second before the master dies: the new master never has that second's writes (the
    # one left confirms what it gets next). Every idempotent call of the load is then
    # repeated, in the same run, by a second client (the first remembers outcomes).
    # Sentinel's down-after is 2 s here: at 1 s, a Sentinel that had just switched to the
    # new master took it for down before its first PING was due, and a second failover
    # left the group without a replica for 11 s.
    data = tmp_path / "data"
    relays: list[RelayProcess] = []

    def relay(port: int) -> int:
        # In a process of its own: its pumps are not the test's threads (replication_relay).
        relays.append(RelayProcess(port).start())
        return relays[-1].port

    try:
        group = RedisSentinels(tmp_path / "group", relay=relay, replicas=2, down_after=2.0)
        with group, run_scope() as run:
            env = {**group_env(group, data), "TOOLEXEC_REPLICA_ACKS": str(acks)}
            worker_factory(pool=pool, concurrency=8 if pool == "prefork" else 20, env=env)
            settings = Settings.from_env(env)
            client, again = ToolClient(settings), ToolClient(settings)
            try:
                echo = remote_tool("failover_echo", timeout=TIMEOUT, client=client)
                book = remote_tool("failover_book", timeout=TIMEOUT, client=client)
                assert echo(key="warm") == "warm" and book(key="warm") == "warm"
                load = asyncio.run(_load(group, echo, book, hold=relays[0].hold))
                booked = [
                    c.key for c in load.ended if c.tool == "failover_book" and c.outcome == "ok"
                ]
                repeat = remote_tool("failover_book", timeout=TIMEOUT, client=again)
                repeated = asyncio.run(_repeat(repeat, booked))
            finally:
                client.close()
                again.close()
    finally:
        for each in relays:
            each.close()

    assert run and relays[0].replication_links == 2  # both replicas' streams were held
    report, twice = _judged(f"{pool}, replica acks {acks}", load, data)
    print(f"repeats of the {len(booked)} idempotent calls that succeeded: {dict(repeated)}")
    if acks:
        assert not twice, report
    else:
        assert twice, f"the failover lost no write the repeats could show; {report}"


async def _repeat(book: Any, keys_: list[str]) -> collections.Counter[str]:
    """Call ``book`` again for each key, 20 at a time; the outcomes by kind."""
    gate = asyncio.Semaphore(20)

    async def one(key: str) -> str:
        async with gate:
            try:
                await book.invoke({"key": key})
            except RemoteToolError as exc:
                return type(exc).__name__
            return "ok"

    return collections.Counter(await asyncio.gather(*(one(key) for key in keys_)))


#: What a caller may hear of a call the failover touched (each a ``RemoteToolError``).
_TYPED = ("BrokerUnavailable", "ToolOutcomeUnknown", "ToolTimeoutError", "WorkerLost")


async def _load(
    group: RedisSentinels, echo: Any, book: Any, *, hold: Callable[[], None] | None = None
) -> Load:
    """Calls at :data:`RATE` for :data:`SECONDS`; the master SIGKILLed at :data:`KILL_AT`
    (``hold`` called :data:`HELD` seconds before it)."""
    loop = asyncio.get_running_loop()
    start = time.monotonic()
    watch = LoopWatch(start)
    watching = asyncio.ensure_future(watch.run())
    ended: list[Ended] = []
    moments: dict[str, float] = {}

    def kill_and_wait() -> None:
        old = group.master_port()
        assert old is not None
        if hold is not None:
            hold()
            time.sleep(HELD)  # the writes of this second reach the master alone
        group.server_on(old).kill()
        moments["killed"] = time.monotonic() - start
        group.wait_for_failover(old, timeout=30)
        moments["known"] = time.monotonic() - start

    async def one(tool: Any, name: str, key: str) -> None:
        began = time.monotonic() - start
        try:
            await tool.invoke({"key": key})
            outcome = "ok"
        except RemoteToolError as exc:
            outcome = type(exc).__name__
        except Exception as exc:  # noqa: BLE001 - an untyped failure is what the test counts
            outcome = f"untyped {type(exc).__name__}"
        ended.append(Ended(name, key, began, time.monotonic() - start, outcome))

    with concurrent.futures.ThreadPoolExecutor(1) as killer:
        killing: asyncio.Future[None] | None = None
        calls = []
        for i in range(int(RATE * SECONDS)):
            at = start + i / RATE
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            if killing is None and time.monotonic() - start >= KILL_AT - (HELD if hold else 0):
                killing = loop.run_in_executor(killer, kill_and_wait)
            key = uuid.uuid4().hex
            tool, name = (book, "failover_book") if i % 2 else (echo, "failover_echo")
            calls.append(asyncio.ensure_future(one(tool, name, key)))
        await asyncio.gather(*calls)
        assert killing is not None
        await killing
    watching.cancel()
    return Load(ended, moments["killed"], moments["known"], watch)


def test_a_forked_child_keeps_no_copy_of_its_parents_connections_to_the_sentinels(
    tmp_path: Path, worker_factory: WorkerFactory
) -> None:
    with RedisSentinels(tmp_path / "group") as group:
        env = group_env(group, tmp_path / "data")
        worker_factory(pool="prefork", concurrency=1, env=env)
        client = ToolClient(Settings.from_env(env))
        try:
            assert remote_tool("failover_echo", timeout=10, client=client)(key="p") == "p"
            ports = {sentinel.port for sentinel in group.sentinels}
            inherited = _to_sentinels(ports)
            assert inherited  # the parent's client asked them for the master, and keeps them
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: its copies are let go of as it starts
                try:
                    kept = sorted(_to_sentinels(ports) & inherited)
                    os.write(write, json.dumps(kept).encode())
                finally:
                    os._exit(0)
            os.close(write)
            with os.fdopen(read) as answer:
                kept = json.loads(answer.read())
            os.waitpid(pid, 0)
            assert kept == []
            assert _to_sentinels(ports) >= inherited  # the parent's own are untouched
            assert remote_tool("failover_echo", timeout=10, client=client)(key="q") == "q"
        finally:
            client.close()


def test_status_watch_asks_the_sentinels_once_not_at_every_snapshot(tmp_path: Path) -> None:
    with RedisSentinels(tmp_path / "group") as group:
        env = {**os.environ, **group_env(group, tmp_path / "data")}

        def connections() -> int:
            total = 0
            for sentinel in group.sentinels:
                with sentinel.client() as client:
                    total += int(client.info("stats")["total_connections_received"])
            return total

        def watch(snapshots: int) -> int:
            """Connections the Sentinels took while ``status --watch`` took ``snapshots``."""
            before = connections()
            watched = subprocess.run(
                [sys.executable, "-m", "toolexec", "status", "--watch", "--json"]
                + ["--count", str(snapshots), "--interval", "0.1"],
                check=False,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert watched.returncode == 0, watched.stderr
            assert len(watched.stdout.splitlines()) == snapshots
            return connections() - before - len(group.sentinels)  # less the looks' own

        few, many = watch(2), watch(10)

    # The watch's client asks the Sentinels as it connects; a client made for each
    # snapshot's queues asked them again at every one (8 snapshots more: 8 more).
    assert many - few <= 1, f"{few} connections for 2 snapshots, {many} for 10"


def _to_sentinels(ports: set[int]) -> set[tuple[str, int]]:
    """This process's open TCP connections to a Sentinel on ``ports``, by local address."""
    return {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.Process().net_connections("tcp")
        if c.raddr and c.raddr.port in ports
    }


def test_the_doctor_sees_the_group_whole_then_names_a_replica_gone_and_a_sentinel_gone(
    tmp_path: Path,
) -> None:
    with RedisSentinels(tmp_path / "group") as group:
        settings = Settings.from_env(group_env(group, tmp_path / "data"))

        healthy = sentinels(settings)
        assert healthy.ok, healthy.message
        assert (
            f"TOOLEXEC_BROKER_URL and TOOLEXEC_REDIS_URL: 3 of 3 Sentinels answer (quorum 2); "
            f"3 name the master 127.0.0.1:{group.master.port} of 'toolexec'; 1 replica(s) up"
        ) == healthy.message

        group.replica.kill()
        assert wait_until(lambda: not sentinels(settings).ok, timeout=15)
        no_replica = sentinels(settings)
        assert "no replica of" in no_replica.message and no_replica.fix

        gone = group.sentinels[2]
        gone.kill()
        without_one = sentinels(settings)
        assert f"the Sentinel at 127.0.0.1:{gone.port} does not answer" in without_one.message
        assert "2 of 3 Sentinels" not in without_one.message  # a failed check says what is wrong


def test_the_doctor_passes_without_a_sentinel_url_saying_each_role_is_one_server() -> None:
    check = sentinels(Settings.from_env({"TOOLEXEC_BROKER_URL": "redis://127.0.0.1:1/0"}))

    assert check.ok and "each role is one Redis server" in check.message


def test_a_group_behind_a_password_is_reached_with_it_in_the_first_sentinels_url(
    tmp_path: Path, worker_factory: WorkerFactory
) -> None:
    with RedisSentinels(tmp_path / "group", password="s3cret/pass") as group:
        assert group.url.startswith("sentinel://:s3cret%2Fpass@127.0.0.1:")
        env = group_env(group, tmp_path / "data")
        settings = Settings.from_env(env)
        assert "s3cret" not in repr(settings)
        worker_factory(pool="prefork", concurrency=1, env=env)
        client = ToolClient(settings)
        try:
            assert remote_tool("failover_echo", timeout=10, client=client)(key="a") == "a"
        finally:
            client.close()
        check = sentinels(settings)
        assert check.ok, check.message
        with (
            redis.Redis(port=group.master.port, socket_timeout=2) as anyone,
            pytest.raises(redis.AuthenticationError),
        ):
            anyone.set("x", 1)  # the group's servers want the password


def test_a_group_that_speaks_only_tls_is_reached_with_tls_parameters_ending_its_url(
    tmp_path: Path, worker_factory: WorkerFactory
) -> None:
    tls = make_tls_files(tmp_path / "tls")
    with RedisSentinels(tmp_path / "group", tls=tls) as group:
        assert "/0?ssl_cert_reqs=required&ssl_ca_certs=" in group.url
        env = group_env(group, tmp_path / "data")
        worker_factory(pool="prefork", concurrency=1, env=env)
        client = ToolClient(Settings.from_env(env))
        try:
            assert remote_tool("failover_echo", timeout=10, client=client)(key="t") == "t"
        finally:
            client.close()
        check = sentinels(Settings.from_env(env))
        assert check.ok, check.message
        with (
            redis.Redis(port=group.master.port, socket_timeout=2) as plain,
            pytest.raises(redis.ConnectionError),
        ):
            plain.ping()  # the group's servers speak TLS only
