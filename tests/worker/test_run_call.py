"""executor.task.run_call and executor.delivery.finish, called directly: the branches a
worker adds nothing to."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
import redis

import executor.task
from executor.delivery import finish
from executor.errors import StoreUnavailable
from executor.task import run_call
from executor.worker import holder
from toolexec import RedisServer
from wire import keys
from wire.formats import KeyState, parse_state, running_state, stored_state, waiter_entry
from wire.models import CallOutcome, ErrorKind
from wire.settings import Settings

from .conftest import Register
from .support import make_call, next_reply, no_reply, unique

WORKER = "direct@host"


def test_run_call_drops_fields_without_a_call_id_and_pushes_nothing(
    client: redis.Redis, settings: Settings, register: Register, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[int] = []
    name = register(lambda: runs.append(1), description="Count a run.")
    reply_to = unique("client")

    with caplog.at_level(logging.ERROR, logger="executor.task"):
        result = run_call({"tool": name, "reply_to": reply_to}, settings=settings, worker=WORKER)

    assert result is None
    assert runs == []
    assert no_reply(client, reply_to)
    assert [r.getMessage() for r in caplog.records] == [
        "dropped a malformed toolexec message: 1 problems"
    ]


def test_run_call_refuses_an_expired_idempotent_call_stores_nothing_and_frees_its_claim(
    client: redis.Redis, settings: Settings, register: Register
) -> None:
    runs: list[int] = []

    def tick() -> int:
        """Count a run."""
        runs.append(1)
        return 1

    key = unique("key")
    call = make_call(
        register(tick, idempotent=True), deadline=time.time() - 0.5, idempotency_key=key
    )
    client.set(keys.claim(key), call.call_id, ex=60)

    refusal = run_call(call.model_dump(mode="json"), settings=settings, worker=WORKER)

    assert refusal is not None and refusal.error is not None
    assert refusal.error.kind is ErrorKind.EXPIRED
    assert next_reply(client, call.reply_to) == (call.call_id, refusal)
    assert runs == []
    assert not client.exists(keys.state(key))
    assert not client.exists(keys.claim(key))


def test_run_call_answers_a_tool_it_does_not_have_with_not_found(
    client: redis.Redis, settings: Settings
) -> None:
    call = make_call(unique("missing"))

    outcome = run_call(call.model_dump(mode="json"), settings=settings, worker=WORKER)

    assert outcome is not None and outcome.error is not None
    assert outcome.error.kind is ErrorKind.NOT_FOUND
    assert next_reply(client, call.reply_to) == (call.call_id, outcome)


def test_run_call_returns_the_stored_outcome_of_an_idempotent_call_without_running_it(
    client: redis.Redis, settings: Settings, register: Register
) -> None:
    runs: list[int] = []
    name = register(lambda: runs.append(1), description="Count a run.", idempotent=True)
    key = unique("key")
    stored = CallOutcome.success("earlier-call", {"ticket": "T-1"}, worker="w@h")
    client.set(keys.state(key), stored_state(stored.model_dump_json()), ex=60)
    call = make_call(name, idempotency_key=key)

    answer = run_call(call.model_dump(mode="json"), settings=settings, worker=WORKER)

    assert answer == stored
    assert runs == []
    call_id, outcome = next_reply(client, call.reply_to)
    assert (call_id, outcome.result) == (call.call_id, {"ticket": "T-1"})


def test_run_call_joins_a_call_that_a_live_process_of_the_same_worker_holds(
    client: redis.Redis, settings: Settings, register: Register, live_pid: int
) -> None:
    runs: list[int] = []
    name = register(
        lambda: runs.append(1), description="Count a run.", idempotent=True, hard_timeout=20
    )
    key = unique("key")
    client.set(keys.state(key), running_state(holder(WORKER, live_pid)), ex=60)
    call = make_call(name, idempotency_key=key, deadline=time.time() + 10)

    assert run_call(call.model_dump(mode="json"), settings=settings, worker=WORKER) is None

    assert runs == []
    assert no_reply(client, call.reply_to)
    assert client.lrange(keys.waiters(key), 0, -1) == [
        waiter_entry(call.reply_to, call.call_id).encode()
    ]
    # The waiters list outlives every delivery that may still run the call:
    # deadline (10 s) + hard limit (20 s) + claim margin (5 s), the deadline counted on
    # the shared clock (Redis' TIME), which may stand a few ms from this process's.
    assert 34_000 < client.pttl(keys.waiters(key)) <= 35_100
    # Still the live holder's, now flagged: callers wait to be told.
    assert parse_state(client.get(keys.state(key))) == KeyState(
        holder=holder(WORKER, live_pid), waiters=True
    )


def test_a_second_delivery_of_a_key_this_process_runs_joins_it_under_the_joining_tag(
    client: redis.Redis, settings: Settings, register: Register
) -> None:
    # Two deliveries of one key in one process (the threads or asyncio pool): the second
    # must join the first, not take its marker as this process's own stale one.
    started, release = threading.Event(), threading.Event()
    runs: list[int] = []

    def book() -> str:
        """Book once."""
        runs.append(1)
        started.set()
        release.wait(10)
        return "booked"

    name = register(book, idempotent=True)
    key = unique("key")
    first, second = make_call(name, idempotency_key=key), make_call(name, idempotency_key=key)
    outcomes: list[CallOutcome | None] = []
    running = threading.Thread(
        target=lambda: outcomes.append(
            run_call(first.model_dump(mode="json"), settings=settings, worker=WORKER)
        )
    )
    running.start()
    try:
        assert started.wait(5)
        joined = run_call(second.model_dump(mode="json"), settings=settings, worker=WORKER)
        state = parse_state(client.get(keys.state(key)))
        waiters = client.lrange(keys.waiters(key), 0, -1)
    finally:
        release.set()
        running.join(10)

    assert joined is None
    assert state == KeyState(holder=holder(WORKER), waiters=True)  # still the running delivery's
    assert waiters == [waiter_entry(second.reply_to, second.call_id).encode()]
    assert runs == [1]
    assert outcomes and outcomes[0] is not None
    assert next_reply(client, first.reply_to) == (first.call_id, outcomes[0])
    call_id, outcome = next_reply(client, second.reply_to)
    assert (call_id, outcome.result) == (second.call_id, "booked")


def test_run_call_takes_over_a_call_held_by_an_exited_process_of_the_same_worker(
    client: redis.Redis, settings: Settings, register: Register, exited_pid: int
) -> None:
    runs: list[int] = []

    def tick() -> str:
        """Count a run."""
        runs.append(1)
        return "ran"

    key = unique("key")
    client.set(keys.state(key), running_state(holder(WORKER, exited_pid)), ex=60)
    call = make_call(register(tick, idempotent=True), idempotency_key=key)

    outcome = run_call(call.model_dump(mode="json"), settings=settings, worker=WORKER)

    assert outcome == CallOutcome.success(call.call_id, "ran", worker=WORKER)
    assert runs == [1]
    assert next_reply(client, call.reply_to) == (call.call_id, outcome)
    assert outcome is not None
    assert parse_state(client.get(keys.state(key))) == KeyState(outcome=outcome.model_dump_json())


def test_run_call_stores_the_success_of_an_idempotent_call_for_its_repeats(
    client: redis.Redis, settings: Settings, register: Register
) -> None:
    key = unique("key")
    call = make_call(
        register(lambda: "booked", description="Book.", idempotent=True), idempotency_key=key
    )

    outcome = run_call(call.model_dump(mode="json"), settings=settings, worker=WORKER)

    assert outcome is not None and outcome.ok
    # The stored outcome replaces the running delivery's holder tag in the key's state.
    assert parse_state(client.get(keys.state(key))) == KeyState(outcome=outcome.model_dump_json())
    assert (
        settings.outcome_ttl * 1000 - 5_000
        < client.pttl(keys.state(key))
        <= settings.outcome_ttl * 1000
    )


@pytest.mark.parametrize("cache_errors", [False, True])
def test_run_call_stores_a_failed_idempotent_call_only_with_cache_errors(
    client: redis.Redis, settings: Settings, register: Register, cache_errors: bool
) -> None:
    def decline() -> None:
        """Always fails."""
        raise ValueError("card declined")

    key = unique("key")
    call = make_call(
        register(decline, idempotent=True, cache_errors=cache_errors), idempotency_key=key
    )
    client.set(keys.claim(key), call.call_id, ex=60)

    outcome = run_call(call.model_dump(mode="json"), settings=settings, worker=WORKER)

    assert outcome is not None and outcome.error is not None
    assert (outcome.error.kind, outcome.error.type) == (ErrorKind.EXECUTION, "ValueError")
    assert next_reply(client, call.reply_to) == (call.call_id, outcome)
    assert (parse_state(client.get(keys.state(key))).outcome is not None) is cache_errors
    # Not stored: the state and the claim are freed so that a retry runs the call again.
    assert bool(client.exists(keys.state(key))) is cache_errors
    assert bool(client.exists(keys.claim(key))) is cache_errors


def test_finish_replaces_a_result_over_the_size_limit_with_an_error(
    client: redis.Redis, settings: Settings
) -> None:
    small = settings.model_copy(update={"max_result_bytes": 200})
    call = make_call("report")

    finish(call, CallOutcome.success(call.call_id, "x" * 500), settings=small)

    call_id, outcome = next_reply(client, call.reply_to)
    assert call_id == call.call_id
    assert outcome.error is not None and outcome.error.type == "ResultTooLarge"


def test_run_call_logs_an_outcome_it_cannot_deliver_instead_of_raising(
    settings: Settings, register: Register, caplog: pytest.LogCaptureFixture, closed_port: int
) -> None:
    unreachable = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{closed_port}/0"})
    call = make_call(register(lambda: "done", description="Finish."))

    with caplog.at_level(logging.ERROR, logger="executor.delivery"):
        outcome = run_call(call.model_dump(mode="json"), settings=unreachable, worker=WORKER)

    assert outcome is not None and outcome.result == "done"
    assert any(
        f"could not deliver the outcome of call {call.call_id}" in r.getMessage()
        for r in caplog.records
    )


def test_an_idempotent_call_begun_while_redis_is_away_runs_once_when_it_comes_back(
    settings: Settings, register: Register, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Redis restarts as a worker begins an idempotent call: the begin step is tried
    # again until Redis answers, and the call runs once (not "ToolExecutionError:
    # ConnectionError", which would tell the caller a tool failed that never ran).
    runs: list[int] = []

    def tick() -> int:
        """Count a run."""
        runs.append(1)
        return len(runs)

    with RedisServer(directory=tmp_path / "away") as server:
        away = settings.model_copy(update={"redis_url": server.url})
        call = make_call(register(tick, idempotent=True), idempotency_key=unique("key"))
        server.stop()
        back = threading.Timer(0.5, server.start)  # the outage's length: a duration
        back.start()
        try:
            with caplog.at_level(logging.WARNING, logger="executor.task"):
                outcome = run_call(call.model_dump(mode="json"), settings=away, worker=WORKER)
        finally:
            back.join()
        with redis.Redis.from_url(server.url) as store:
            assert outcome is not None and outcome.ok and outcome.result == 1
            assert runs == [1]
            assert next_reply(store, call.reply_to) == (call.call_id, outcome)
    assert any(f"could not begin call {call.call_id}" in r.getMessage() for r in caplog.records)


def test_an_idempotent_call_whose_redis_stays_away_is_not_run_and_ends_as_store_unavailable(
    settings: Settings, register: Register, monkeypatch: pytest.MonkeyPatch, closed_port: int
) -> None:
    monkeypatch.setattr(executor.task, "_BEGIN_PATIENCE", 0.3)
    unreachable = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{closed_port}/0"})
    runs: list[int] = []
    call = make_call(
        register(lambda: runs.append(1), idempotent=True, description="Count a run."),
        idempotency_key=unique("key"),
    )

    with pytest.raises(StoreUnavailable, match="could not reach Redis .* the call did not run"):
        run_call(call.model_dump(mode="json"), settings=unreachable, worker=WORKER)
    assert runs == []
