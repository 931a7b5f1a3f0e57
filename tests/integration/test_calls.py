"""Calls from the agent process to real workers: results, errors, deadlines, threads.

Every test here runs against the session's probe worker (prefork, concurrency 4, the
starter tools plus ``probe_tools.py``) through this process's configured client.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import threading
import time
import uuid
from typing import Any

import pytest
import redis

from agent_client import (
    RemoteToolError,
    ToolArgumentsInvalid,
    ToolClient,
    ToolExecutionError,
    ToolNotFound,
    ToolTimeoutError,
    WorkerLost,
    remote_tool,
)
from tasks import list_bookings
from tests.redis_stats import calls_of
from toolexec import WorkerProcess
from wire import keys
from wire.settings import Settings

from .polling import wait_until, wait_until_async

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("probe_worker")]


def _is_json(value: Any) -> bool:
    """Whether ``value`` is made of JSON types only and survives a JSON round trip."""
    return bool(json.loads(json.dumps(value, allow_nan=False)) == value)


def _lpush_calls(client: redis.Redis) -> int:
    """How many LPUSH commands the server has run: the client publishes a call with one."""
    return calls_of(client, "lpush")


# -- round trips -----------------------------------------------------------------------


def test_a_real_tool_returns_the_same_json_through_every_calling_style(
    tool_client: ToolClient,
) -> None:
    search = remote_tool("search", timeout=10)
    arguments = {"query": "red-headed league pawnbroker", "limit": 2}

    by_run_sync = search.run_sync(**arguments)
    by_call = search(**arguments)

    async def both_async() -> tuple[Any, Any]:
        return await search.run(**arguments), await search.invoke(arguments)

    by_run, by_invoke = asyncio.run(both_async())

    assert by_run_sync == by_call == by_run == by_invoke
    assert _is_json(by_run_sync)
    assert len(by_run_sync) == 2
    hit = by_run_sync[0]
    assert hit["source"] == "the-red-headed-league.txt"
    assert isinstance(hit["paragraph"], int) and isinstance(hit["score"], float)
    assert "[" in hit["snippet"]


def test_a_side_effecting_tool_books_once_per_call_and_returns_the_booking(
    tool_client: ToolClient, settings: Settings
) -> None:
    booking = remote_tool("book_flight", timeout=10)(flight_id="BA117", passenger="  Ada Lovelace ")
    assert _is_json(booking)
    assert booking["flight_id"] == "BA117"
    assert booking["passenger"] == "Ada Lovelace"  # the worker's pydantic model strips it
    rows = [
        row
        for row in list_bookings(settings.data_dir)
        if row["booking_id"] == booking["booking_id"]
    ]
    assert len(rows) == 1
    assert rows[0]["call_id"]


def test_a_tool_without_arguments_and_an_async_tool_round_trip(tool_client: ToolClient) -> None:
    today = remote_tool("get_today_date", timeout=10)()
    assert _is_json(today)
    assert set(today) >= {"today", "weekday", "tomorrow", "next_weekday"}

    echoed = asyncio.run(remote_tool("probe_async_echo", timeout=10).run(text="from async def"))
    assert echoed["text"] == "from async def"


def test_json_types_survive_the_round_trip_unchanged(tool_client: ToolClient) -> None:
    echo = remote_tool("probe_echo", timeout=10)
    result = echo(text="héllo ✓", number=7, ratio=0.25, flags=[True, False])
    assert _is_json(result)
    assert result["text"] == "héllo ✓"
    assert result["number"] == 7 and type(result["number"]) is int
    assert result["ratio"] == 0.25 and type(result["ratio"]) is float
    assert result["flags"] == [True, False]
    assert result["nested"] == {"items": ["héllo ✓", 7], "none": None}


def test_a_hundred_concurrent_calls_all_succeed_with_their_own_results(
    tool_client: ToolClient, probe_worker: WorkerProcess
) -> None:
    echo = remote_tool("probe_echo", timeout=30)

    async def hundred() -> list[Any]:
        return await asyncio.gather(*(echo.run(text=f"call-{i}", number=i) for i in range(100)))

    results = asyncio.run(hundred())

    assert [r["text"] for r in results] == [f"call-{i}" for i in range(100)]
    assert [r["number"] for r in results] == list(range(100))
    assert len({r["call_id"] for r in results}) == 100
    assert {r["pid"] for r in results} <= set(probe_worker.child_pids())
    assert tool_client.replies.pending == 0


# -- errors ----------------------------------------------------------------------------


def test_an_unknown_tool_is_not_found_and_the_error_lists_the_available_tools(
    tool_client: ToolClient,
) -> None:
    with pytest.raises(ToolNotFound) as raised:
        remote_tool("no_such_tool")
    error = raised.value
    assert error.tool == "no_such_tool"
    assert "no_such_tool" in str(error)
    assert {"search", "book_flight", "probe_echo"} <= set(error.available)
    assert "search" in str(error) and "probe_echo" in str(error)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("run_id", 123),
        ("run_id", ""),
        ("idempotency_key", "k" * 10_000),
        ("idempotency_key", {"a": 1}),
    ],
)
def test_a_run_id_or_key_the_wire_cannot_carry_is_refused_and_nothing_is_sent(
    tool_client: ToolClient, redis_client: redis.Redis, option: str, value: Any
) -> None:
    today = remote_tool("get_today_date", timeout=10)  # idempotent: it takes a key
    pushes_before = _lpush_calls(redis_client)

    with pytest.raises(
        ValueError, match=f"^{option} must be a non-empty string of at most 1024 characters"
    ):
        today.invoke_sync({}, **{option: value})
    with pytest.raises(ValueError, match=f"^{option} must be a non-empty string"):
        asyncio.run(today.invoke({}, **{option: value}))
    assert _lpush_calls(redis_client) == pushes_before


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"query": "fox", "limit": 100}, "limit"),
        ({"query": "fox", "limit": "five"}, "limit"),
        ({"limit": 3}, "query"),
        ({"query": "fox", "colour": "red"}, "colour"),
    ],
)
def test_bad_arguments_name_the_field_and_send_nothing(
    tool_client: ToolClient, redis_client: redis.Redis, arguments: dict[str, Any], field: str
) -> None:
    search = remote_tool("search", timeout=10)
    pushes_before = _lpush_calls(redis_client)

    with pytest.raises(ToolArgumentsInvalid) as raised:
        search.invoke_sync(arguments)

    assert raised.value.tool == "search"
    assert field in str(raised.value)
    assert any(field in problem for problem in raised.value.problems)
    assert _lpush_calls(redis_client) == pushes_before, "an invalid call was published"
    assert tool_client.replies.pending == 0
    # The measure works: a valid call is one LPUSH.
    search.invoke_sync({"query": "fox", "limit": 1})
    assert _lpush_calls(redis_client) == pushes_before + 1


def test_a_tool_that_raises_reports_the_remote_type_and_message(tool_client: ToolClient) -> None:
    with pytest.raises(ToolExecutionError) as raised:
        remote_tool("probe_fail", timeout=10)(message="boom: the probe failed on purpose")
    assert raised.value.tool == "probe_fail"
    assert raised.value.remote_type == "ProbeFailure"
    assert raised.value.remote_message == "boom: the probe failed on purpose"
    assert "ProbeFailure" in str(raised.value)

    # A real tool's own error, for a query that passes the schema but has no words.
    with pytest.raises(ToolExecutionError) as raised:
        remote_tool("search", timeout=10)(query="!!!")
    assert raised.value.remote_type == "ValueError"
    assert "no words to search for" in raised.value.remote_message


# -- deadlines -------------------------------------------------------------------------

#: The deadline is exact: the caller is free no later than this after it.
_DEADLINE_SLACK = 0.05


def test_a_short_deadline_frees_a_sync_caller_on_time(
    tool_client: ToolClient, redis_client: redis.Redis
) -> None:
    slow = remote_tool("slow_report", timeout=0.2)
    started = time.monotonic()
    with pytest.raises(ToolTimeoutError) as raised:
        slow(seconds=2)
    elapsed = time.monotonic() - started
    assert 0.2 <= elapsed <= 0.2 + _DEADLINE_SLACK, f"took {elapsed:.3f}s"
    assert raised.value.timeout == 0.2
    assert raised.value.tool == "slow_report"
    # The error names the call it ended: the one the worker holds, running on.
    call_id = raised.value.call_id
    assert call_id is not None
    assert wait_until(lambda: redis_client.exists(keys.running(call_id)) == 1, timeout=1.5), call_id


def test_a_short_deadline_frees_an_async_caller_on_time(tool_client: ToolClient) -> None:
    slow = remote_tool("slow_report")

    async def timed() -> float:
        started = time.monotonic()
        with pytest.raises(ToolTimeoutError):
            await slow.invoke({"seconds": 2}, timeout=0.2)
        return time.monotonic() - started

    elapsed = asyncio.run(timed())
    assert 0.19 <= elapsed <= 0.2 + _DEADLINE_SLACK, f"took {elapsed:.3f}s"


@pytest.mark.parametrize("deadline", [0.001, 0.005, 0.02])
def test_a_deadline_shorter_than_the_way_to_redis_is_a_timeout_not_a_broker_error(
    tool_client: ToolClient, deadline: float
) -> None:
    # Redis answers all along: a call whose deadline passes before its send was taken,
    # or while it is on its way, timed out. Neither "Redis cannot be reached"
    # (BrokerUnavailable) nor "the outcome is unknown" (ToolOutcomeUnknown) is true of it.
    sleeper = remote_tool("probe_sleep", timeout=deadline)

    async def many() -> list[Any]:
        calls = [sleeper.invoke({"seconds": 0.5}) for _ in range(300)]
        return await asyncio.gather(*calls, return_exceptions=True)

    outcomes = asyncio.run(many())
    sync = []
    for _ in range(30):
        try:
            sync.append(sleeper(seconds=0.5))
        except RemoteToolError as exc:
            sync.append(exc)

    kinds = collections.Counter(type(o).__name__ for o in [*outcomes, *sync])
    assert kinds == {"ToolTimeoutError": 330}, kinds


def _listeners() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "toolexec-client-io")


def test_fifty_timed_out_calls_leave_no_thread_behind(tool_client: ToolClient) -> None:
    sleeper = remote_tool("probe_sleep", timeout=0.05)
    # The baseline is taken with no listener, or with this client's one already running.
    assert _listeners() <= 1
    baseline = threading.active_count() - _listeners()

    for _ in range(25):
        with pytest.raises(ToolTimeoutError):
            sleeper(seconds=0.2)

    async def twenty_five() -> tuple[list[Any], int]:
        calls = [asyncio.ensure_future(sleeper.run(seconds=0.2)) for _ in range(25)]
        # Measure while all 25 wait (each for 0.05 s): poll at every turn of the loop.
        assert await wait_until_async(lambda: tool_client.replies.pending == 25, interval=0)
        while_waiting = threading.active_count()
        return await asyncio.gather(*calls, return_exceptions=True), while_waiting

    outcomes, while_waiting = asyncio.run(twenty_five())

    assert all(isinstance(o, ToolTimeoutError) for o in outcomes), outcomes
    names = sorted(t.name for t in threading.enumerate())
    assert while_waiting <= baseline + 1, names
    assert threading.active_count() <= baseline + 1, names
    assert _listeners() == 1, names
    assert tool_client.replies.pending == 0


# -- lost workers ----------------------------------------------------------------------


def test_a_pool_child_killed_mid_call_is_reported_as_worker_lost_at_once(
    tool_client: ToolClient, probe_worker: WorkerProcess, redis_client: redis.Redis
) -> None:
    marker = f"probe:pid:{uuid.uuid4().hex}"
    sleeper = remote_tool("probe_sleep", timeout=20)
    assert not sleeper.idempotent and sleeper.spec.delivery == "at_most_once"

    async def kill_mid_call() -> tuple[float, RemoteToolError]:
        call = asyncio.ensure_future(sleeper.run(seconds=15, marker=marker))
        assert await wait_until_async(lambda: call.done() or redis_client.get(marker) is not None)
        assert not call.done(), call
        pid = int(redis_client.get(marker) or 0)
        assert pid in probe_worker.child_pids()
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerLost) as raised:
            await call
        return time.monotonic() - killed, raised.value

    elapsed, error = asyncio.run(kill_mid_call())

    assert elapsed < 5.0, f"WorkerLost came {elapsed:.2f}s after the kill"
    assert error.tool == "probe_sleep"
    assert "probe_sleep" in str(error)
    # The worker serves on (and Celery replaces the child in the background).
    assert (
        remote_tool("probe_echo", timeout=10)(text="still here", number=1)["text"] == "still here"
    )
