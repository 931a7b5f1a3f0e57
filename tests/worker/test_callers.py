"""executor.callers on a real Redis: an outage is never taken for a caller's death.

A caller is judged gone only when its key stays absent across a whole interval of looks
that Redis took as writes, none more than half an interval after the one before; a
client that closed says so and is judged gone at once. Each test uses a caller id of its
own and an interval of 0.6 s.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest
import redis

from executor import callers
from executor.callers import Verdict, caller_waits, look
from tests.integration.test_tls_acl import documented_acl
from wire import keys
from wire.clock import shared_now
from wire.models import CallRequest
from wire.settings import Settings

INTERVAL = 0.6


@pytest.fixture
def fast(settings: Settings) -> Settings:
    return settings.model_copy(update={"heartbeat_interval": INTERVAL})


def _call(deadline: float | None = None) -> CallRequest:
    return CallRequest(
        call_id=uuid.uuid4().hex,
        tool="echo",
        arguments={},
        reply_to=f"client-{uuid.uuid4().hex}",
        caller_beats=True,
        deadline=deadline,
    )


def test_a_caller_whose_key_is_there_is_alive_and_not_asked_again_for_a_third_of_an_interval(
    client: redis.Redis, fast: Settings
) -> None:
    call = _call()
    client.set(keys.caller(call.reply_to), "1", px=5000)
    assert look(client, call, settings=fast) is Verdict.ALIVE
    client.delete(keys.caller(call.reply_to))
    assert callers.caller_known_waiting(call)  # remembered: no look
    assert caller_waits(client, call, settings=fast)


def test_an_absent_key_is_a_death_only_after_a_whole_interval_of_looks(
    client: redis.Redis, fast: Settings
) -> None:
    call = _call()
    assert look(client, call, settings=fast) is Verdict.UNSURE  # absent: the count starts
    started = time.monotonic()
    assert caller_waits(client, call, settings=fast) is False
    assert time.monotonic() - started >= INTERVAL * 0.8  # the first look came before
    # The verdict is kept in the key: any worker now sheds the caller's calls at once.
    assert client.get(keys.caller(call.reply_to)) == b"gone"
    assert (
        look(client, _call().model_copy(update={"reply_to": call.reply_to}), settings=fast)
        is Verdict.GONE
    )


def test_a_key_written_again_after_an_outage_keeps_the_callers_calls(
    client: redis.Redis, fast: Settings
) -> None:
    # A restart lost the key; the client writes it again a moment after Redis is back.
    call = _call()
    threading.Timer(
        INTERVAL / 2, lambda: client.set(keys.caller(call.reply_to), "1", px=5000)
    ).start()
    assert caller_waits(client, call, settings=fast) is True
    assert not client.exists(keys.caller_absent(call.reply_to))  # the count of absence is dropped


def test_a_pause_of_redis_breaks_the_count_of_absence_and_it_starts_again(
    client: redis.Redis, fast: Settings
) -> None:
    call = _call()
    assert look(client, call, settings=fast) is Verdict.UNSURE
    # Redis takes no write for longer than half an interval (a CLIENT PAUSE): the look
    # after it waits for the pause to end, and finds the chain broken.
    client.execute_command("CLIENT", "PAUSE", int(INTERVAL * 1.5 * 1000), "WRITE")
    try:
        verdict = look(client, call, settings=fast)
    finally:
        client.execute_command("CLIENT", "UNPAUSE")
    assert verdict is Verdict.UNSURE  # more than an interval since the first look, still not dead


def test_a_client_that_closed_is_gone_at_once(client: redis.Redis, fast: Settings) -> None:
    call = _call()
    client.set(keys.caller(call.reply_to), "gone", px=5000)
    started = time.monotonic()
    assert caller_waits(client, call, settings=fast) is False
    assert time.monotonic() - started < INTERVAL / 2


def test_a_call_whose_deadline_passes_while_the_verdict_is_out_is_left_to_its_deadline_check(
    client: redis.Redis, fast: Settings
) -> None:
    call = _call(deadline=shared_now() + INTERVAL / 4)
    assert caller_waits(client, call, settings=fast) is True  # not judged: its deadline refuses it
    assert shared_now() >= call.deadline  # type: ignore[operator]


def test_a_redis_that_cannot_be_asked_lets_the_call_run_after_two_intervals(
    fast: Settings, closed_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    call = _call()
    with redis.Redis(port=closed_port, socket_connect_timeout=0.2) as unreachable:
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="executor.callers"):
            assert caller_waits(unreachable, call, settings=fast) is True
    assert time.monotonic() - started >= 2 * INTERVAL
    assert "could not tell" in caplog.text


def test_every_look_runs_as_the_acl_user_docs_security_gives(
    client: redis.Redis, fast: Settings
) -> None:
    # The look's script reads and writes only what the documented ACL allows (a denial
    # would read as "cannot ask" and let a dead caller's call run after two intervals).
    rules = next(line for line in documented_acl() if line.startswith("user toolexec "))
    name = f"look-{uuid.uuid4().hex[:8]}"
    client.execute_command("ACL", "SETUSER", name, *rules.split()[2:], "resetpass", ">secret")
    try:
        kwargs = client.connection_pool.connection_kwargs
        with redis.Redis(
            host=kwargs["host"], port=kwargs["port"], username=name, password="secret"
        ) as limited:
            call = _call()
            assert look(limited, call, settings=fast) is Verdict.UNSURE  # absent: counted
            assert caller_waits(limited, call, settings=fast) is False  # and judged gone
            live = _call()
            limited.set(keys.caller(live.reply_to), "1", px=5000)
            assert look(limited, live, settings=fast) is Verdict.ALIVE
    finally:
        client.execute_command("ACL", "DELUSER", name)


def test_a_client_that_closed_and_is_used_again_is_waited_for_again(
    client: redis.Redis, fast: Settings
) -> None:
    # close() says "gone"; the same client used again beats again under the same id.
    call = _call()
    client.set(keys.caller(call.reply_to), "gone", px=5000)
    assert caller_waits(client, call, settings=fast) is False
    client.set(keys.caller(call.reply_to), "1", px=5000)  # its thread started again
    time.sleep(INTERVAL / 3)  # the verdict is remembered this long (a duration of the rule)
    assert caller_waits(client, call, settings=fast) is True
