"""``TOOLEXEC_REPLICA_ACKS``: a keyed call's begin and stored outcome wait for replicas.

A private master with one replica of its own (``redis-server --replicaof``); the replica
is frozen (``SIGSTOP``, by its PID) where a test needs it behind. ``executor.task.run_call``
is called directly, as a worker's pool process calls it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from executor import claims
from executor.task import run_call
from executor.worker import holder
from tests.integration.outage_support import freeze, frozen, thaw
from tests.redis_stats import calls_of
from toolexec import RedisServer
from toolexec.doctor.durability import replica_acks
from wire import keys
from wire.formats import running_state
from wire.models import ErrorKind
from wire.settings import Settings

from .conftest import Register
from .support import make_call, next_reply, unique, wait_until

WORKER = "replicas@host"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RedisServer, RedisServer]]:
    """A master and its replica, in sync; stopped by PID at the end."""
    root = tmp_path_factory.mktemp("replicas")
    with RedisServer(directory=root / "master") as master:
        replica = RedisServer(
            directory=root / "replica", extra_args=["--replicaof", "127.0.0.1", str(master.port)]
        )
        with replica:
            with redis.Redis(port=replica.port) as client:
                assert wait_until(
                    lambda: client.info("replication").get("master_link_status") == "up"
                ), "the replica did not come in sync"
            yield master, replica


@pytest.fixture
def master(pair: tuple[RedisServer, RedisServer]) -> Iterator[redis.Redis]:
    with redis.Redis(port=pair[0].port) as client:
        yield client


def _settings(master: RedisServer, tmp: Path, acks: int, **more: str) -> Settings:
    return Settings.from_env(
        {
            "TOOLEXEC_BROKER_URL": "memory://",
            "TOOLEXEC_REDIS_URL": master.url,
            "TOOLEXEC_DATA_DIR": str(tmp),
            "TOOLEXEC_REPLICA_ACKS": str(acks),
            **more,
        }
    )


@pytest.mark.parametrize("acks", [0, 1])
def test_a_keyed_call_waits_for_the_replicas_asked_for_at_its_begin_and_its_stored_outcome(
    pair: tuple[RedisServer, RedisServer],
    master: redis.Redis,
    register: Register,
    tmp_path: Path,
    acks: int,
) -> None:
    settings = _settings(pair[0], tmp_path, acks)
    name = register(lambda: "booked", description="Book.", idempotent=True)
    plain = make_call(register(lambda: "echo", description="Echo."))
    keyed = make_call(name, idempotency_key=unique("key"), deadline=time.time() + 10)
    waits = calls_of(master, "wait")

    assert run_call(plain.model_dump(mode="json"), settings=settings, worker=WORKER) is not None
    assert calls_of(master, "wait") == waits  # a plain call stores nothing: no wait
    outcome = run_call(keyed.model_dump(mode="json"), settings=settings, worker=WORKER)

    assert outcome is not None and outcome.result == "booked"
    assert next_reply(master, keyed.reply_to) == (keyed.call_id, outcome)
    assert calls_of(master, "wait") == waits + 2 * acks  # the begin's, and the outcome's


def test_a_begin_the_replicas_do_not_have_by_the_deadline_never_runs_and_lets_the_key_go(
    pair: tuple[RedisServer, RedisServer],
    master: redis.Redis,
    register: Register,
    tmp_path: Path,
) -> None:
    settings = _settings(pair[0], tmp_path, 1)
    runs: list[int] = []
    name = register(lambda: runs.append(1) or len(runs), description="Count.", idempotent=True)
    key = unique("key")
    claimed = make_call(name, idempotency_key=key, deadline=time.time() + 1.0)
    master.set(keys.claim(key), claimed.call_id)

    started = time.monotonic()
    with frozen(pair[1]):
        refusal = run_call(claimed.model_dump(mode="json"), settings=settings, worker=WORKER)
    waited = time.monotonic() - started

    assert refusal is not None and refusal.error is not None
    assert refusal.error.kind is ErrorKind.EXPIRED
    assert refusal.error.type == "ReplicasBehind"
    assert "on 0 of the 1 replicas" in refusal.error.message
    assert runs == []
    assert 0.8 < waited < 2.0, f"waited {waited:.2f}s for a deadline 1 s away"
    assert next_reply(master, claimed.reply_to) == (claimed.call_id, refusal)
    assert not master.exists(keys.state(key))  # let go: a retry runs it
    assert not master.exists(keys.claim(key))

    retry = make_call(name, idempotency_key=key, deadline=time.time() + 10)
    outcome = run_call(retry.model_dump(mode="json"), settings=settings, worker=WORKER)
    assert outcome is not None and outcome.result == 1 and runs == [1]


def test_a_stored_outcome_the_replicas_do_not_confirm_is_delivered_and_logged(
    pair: tuple[RedisServer, RedisServer],
    master: redis.Redis,
    register: Register,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = _settings(pair[0], tmp_path, 1)
    froze = threading.Event()

    def book() -> str:
        """Book, while the replica falls behind."""
        freeze(pair[1])
        froze.set()
        return "booked"

    call = make_call(
        register(book, description="Book.", idempotent=True),
        idempotency_key=unique("key"),
        deadline=time.time() + 0.5,  # its outcome's wait: OUTCOME_REPLICA_WAIT, 1 s
    )
    try:
        with caplog.at_level(logging.WARNING, logger="executor.claims"):
            outcome = run_call(call.model_dump(mode="json"), settings=settings, worker=WORKER)
    finally:
        thaw(pair[1])

    assert froze.is_set()
    assert outcome is not None and outcome.result == "booked"
    assert next_reply(master, call.reply_to) == (call.call_id, outcome)
    warned = (
        f"call {call.call_id} of {call.tool}: Redis has its stored outcome on 0 of 1 "
        "replicas; a failover now could forget it"
    )
    assert [r.getMessage() for r in caplog.records] == [warned]


def test_the_doctor_counts_the_replicas_online_against_the_acks_asked_for(
    pair: tuple[RedisServer, RedisServer], master: redis.Redis, tmp_path: Path
) -> None:
    enough = replica_acks(_settings(pair[0], tmp_path, 1), master)
    too_many = replica_acks(_settings(pair[0], tmp_path, 2), master)
    none_asked = replica_acks(_settings(pair[0], tmp_path, 0), master)

    assert enough.ok and "has 1 replica(s) online" in enough.message
    assert (
        not too_many.ok and "has 1 replica(s) online; TOOLEXEC_REPLICA_ACKS=2" in too_many.message
    )
    assert none_asked.ok and "TOOLEXEC_REPLICA_ACKS is 0" in none_asked.message


def test_a_call_without_a_deadline_waits_for_the_replicas_only_as_long_as_its_state_lasts(
    pair: tuple[RedisServer, RedisServer], master: redis.Redis, register: Register, tmp_path: Path
) -> None:
    # Its running state lives TOOLEXEC_OUTCOME_TTL (1 s here) plus the claim margin (0).
    settings = _settings(pair[0], tmp_path, 1, TOOLEXEC_OUTCOME_TTL="1", TOOLEXEC_CLAIM_MARGIN="0")
    runs: list[int] = []
    key = unique("key")
    call = make_call(
        register(lambda: runs.append(1), description="Count.", idempotent=True),
        idempotency_key=key,
    )
    assert call.deadline is None

    started = time.monotonic()
    with frozen(pair[1]):
        refusal = run_call(call.model_dump(mode="json"), settings=settings, worker=WORKER)
    waited = time.monotonic() - started

    assert refusal is not None and refusal.error is not None
    assert refusal.error.type == "ReplicasBehind"
    assert refusal.error.message.endswith("when its state lapsed")
    assert runs == [] and 0.8 < waited < 3.0, f"waited {waited:.2f}s"
    assert not master.exists(keys.state(key))


def test_a_begin_whose_state_is_not_its_own_any_more_is_not_counted_as_replicated(
    pair: tuple[RedisServer, RedisServer], master: redis.Redis
) -> None:
    # What a pipeline resent to a new master after a failover meets: no state, or one
    # that another delivery holds. Renewing writes nothing there, so WAIT counts nothing.
    call = make_call("t", idempotency_key=unique("key"), deadline=time.time() + 5)
    state = keys.state(call.idempotency_key or "")
    ours, theirs = "w1@host:1", "w2@host:2"

    def replicated() -> bool:
        return claims._replicated(
            master, call, state, holder=ours, ttl_ms=5000, replicas=1, left=lambda: 5.0
        )

    assert replicated() is False  # no state at all
    master.set(state, running_state(theirs), px=5000)
    assert replicated() is False
    master.set(state, running_state(ours), px=5000)
    assert replicated() is True
    master.delete(state)


def test_callers_that_joined_have_the_outcome_before_the_worker_waits_for_its_replicas(
    pair: tuple[RedisServer, RedisServer],
    master: redis.Redis,
    register: Register,
    tmp_path: Path,
) -> None:
    settings = _settings(pair[0], tmp_path, 1)
    key = unique("key")
    joiner = make_call("booking", idempotency_key=key, deadline=time.time() + 0.5)
    returned: list[float] = []

    def book() -> str:
        """Book, while a second delivery joins and the replica falls behind."""
        # Another worker's delivery of the key, which finds this live process running it.
        state, _ = claims.begin(
            master, joiner, holder=holder("other@host"), hostname=WORKER, ttl_ms=5000
        )
        assert state == "busy"  # joined: this process runs the key
        freeze(pair[1])
        returned.append(time.monotonic())
        return "booked"

    name = register(book, description="Book.", idempotent=True)
    call = make_call(name, idempotency_key=key, deadline=time.time() + 0.5)
    heard: list[float] = []

    def listen() -> None:
        next_reply(master, joiner.reply_to, timeout=10)
        heard.append(time.monotonic())

    listener = threading.Thread(target=listen)
    listener.start()
    try:
        run_call(call.model_dump(mode="json"), settings=settings, worker=WORKER)
        ended = time.monotonic()
    finally:
        thaw(pair[1])
        listener.join(10)

    assert heard, "the joined caller heard nothing"
    # The outcome's wait lasts 1 s at least (OUTCOME_REPLICA_WAIT); the joiner was told
    # before it began, not after it ended.
    assert ended - returned[0] >= 0.9
    assert heard[0] - returned[0] < 0.5, f"told {heard[0] - returned[0]:.2f}s after the tool"
