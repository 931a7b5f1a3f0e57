"""executor.retries: a tool's retries are checked at registration, paced, and cut off in time."""

from __future__ import annotations

import asyncio
import itertools
import math
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agent_client.errors import ToolExecutionError, result_of
from executor import stats
from executor.errors import ToolDefinitionError
from executor.registry import get_tool, tool, unregister
from executor.retries import DEFAULT_BACKOFF, MAX_BACKOFF, MAX_RETRIES, Attempts, RetryPolicy
from executor.runner import execute, execute_async
from tests.unit.test_stats import FakeRedis
from toolexec.commands.render import _counts
from wire import keys
from wire.clock import shared_now
from wire.models import (
    MAX_RETRY_PAUSE,
    CallOutcome,
    CallRequest,
    ErrorInfo,
    ErrorKind,
    ToolSpec,
    retry_pause_bound,
)

Register = Callable[..., str]


@pytest.fixture
def register() -> Iterator[Register]:
    """Register ``func`` under a fresh name with ``options``; unregistered after the test."""
    names: list[str] = []

    def _register(func: Callable[..., Any], **options: Any) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        names.append(name)
        tool(name=name, description="A test tool.", **options)(func)
        return name

    yield _register
    for name in names:
        unregister(name)


def _request(name: str, *, deadline: float | None = None, **arguments: Any) -> CallRequest:
    return CallRequest(
        call_id=f"c-{uuid.uuid4().hex}", tool=name, arguments=arguments, deadline=deadline
    )


def _failing(
    times: int, exc: type[Exception] = ConnectionError
) -> tuple[Callable[[], str], list[int]]:
    """A tool that raises ``exc`` on its first ``times`` runs, then returns "done"."""
    runs: list[int] = []

    def flaky() -> str:
        runs.append(1)
        if len(runs) <= times:
            raise exc(f"down ({len(runs)})")
        return "done"

    return flaky, runs


def _never_returns() -> str:
    raise ConnectionError("down")


# -- registration ------------------------------------------------------------------------


def test_a_tool_retries_nothing_by_default(register: Register) -> None:
    definition = get_tool(register(_never_returns))

    assert definition is not None
    assert (definition.retry.retries, definition.spec.retries) == (0, 0)


@pytest.mark.parametrize("retries", [-1, MAX_RETRIES + 1, 1.5, True, "3", None])
def test_retries_that_are_not_a_whole_number_from_0_to_100_are_refused(
    register: Register, retries: Any
) -> None:
    with pytest.raises(ToolDefinitionError, match=r"retries must be a whole number from 0 to 100"):
        register(_never_returns, retries=retries, retry_on=ConnectionError)


@pytest.mark.parametrize("backoff", [-0.1, MAX_BACKOFF + 1, math.nan, math.inf, True, "1", None])
def test_a_retry_backoff_that_is_not_0_to_3600_seconds_is_refused(
    register: Register, backoff: Any
) -> None:
    with pytest.raises(
        ToolDefinitionError, match=r"retry_backoff must be a number of seconds from 0 to 3600"
    ):
        register(_never_returns, retries=2, retry_on=ConnectionError, retry_backoff=backoff)


def test_an_at_most_once_tool_that_retries_must_list_what_it_retries(register: Register) -> None:
    with pytest.raises(
        ToolDefinitionError,
        match=r"at-most-once tool retries only the exceptions it lists: add retry_on=",
    ):
        register(_never_returns, retries=2)


def test_an_at_least_once_tool_retries_any_exception_unless_told_otherwise(
    register: Register,
) -> None:
    idempotent = get_tool(register(_never_returns, retries=2, idempotent=True))
    at_least_once = get_tool(register(_never_returns, retries=2, delivery="at_least_once"))

    assert idempotent is not None and at_least_once is not None
    assert idempotent.retry.retry_on == at_least_once.retry.retry_on == (Exception,)


def test_one_exception_class_or_a_tuple_of_them_is_accepted(register: Register) -> None:
    one = get_tool(register(_never_returns, retries=1, retry_on=ConnectionError))
    two = get_tool(register(_never_returns, retries=1, retry_on=(ConnectionError, TimeoutError)))

    assert one is not None and two is not None
    assert (one.retry.retry_on, two.retry.retry_on) == (
        (ConnectionError,),
        (ConnectionError, TimeoutError),
    )


@pytest.mark.parametrize(
    ("retry_on", "problem"),
    [
        ((), r"retry_on=\(\) retries nothing"),
        ("ConnectionError", r"takes an exception class or a tuple of them, got 'ConnectionError'"),
        ([ConnectionError], r"takes an exception class or a tuple of them"),
        ((ConnectionError, int), r"takes an exception class or a tuple of them, got <class 'int'>"),
        (KeyboardInterrupt, r"lists KeyboardInterrupt, which is never retried"),
        ((ValueError, SystemExit), r"lists SystemExit, which is never retried"),
        (asyncio.CancelledError, r"lists CancelledError, which is never retried"),
    ],
)
def test_retry_on_that_is_not_exception_classes_is_refused_saying_why(
    register: Register, retry_on: Any, problem: str
) -> None:
    with pytest.raises(ToolDefinitionError, match=problem):
        register(_never_returns, retries=1, retry_on=retry_on)


def test_retry_on_without_retries_is_refused(register: Register) -> None:
    with pytest.raises(ToolDefinitionError, match=r"retry_on has no effect without retries"):
        register(_never_returns, retry_on=ConnectionError)


def test_the_spec_publishes_the_retries_and_the_backoff(register: Register) -> None:
    definition = get_tool(register(_never_returns, retries=3, retry_on=OSError, retry_backoff=2))

    assert definition is not None
    assert (definition.spec.retries, definition.spec.retry_backoff) == (3, 2.0)
    assert definition.retry == RetryPolicy(retries=3, retry_on=(OSError,), backoff=2.0)
    assert get_tool(register(_never_returns)).spec.retry_backoff == DEFAULT_BACKOFF  # type: ignore[union-attr]


# -- the backoff schedule ----------------------------------------------------------------


def test_each_pause_bound_doubles_from_the_backoff_up_to_the_cap() -> None:
    assert [retry_pause_bound(k, 0.5) for k in range(1, 6)] == [0.5, 1.0, 2.0, 4.0, 8.0]
    assert retry_pause_bound(30, 0.5) == MAX_RETRY_PAUSE
    assert (
        retry_pause_bound(MAX_RETRIES, MAX_BACKOFF) == MAX_BACKOFF
    )  # a backoff above the cap is its own cap
    assert retry_pause_bound(4, 0.0) == 0.0


@pytest.mark.parametrize("attempt", [1, 2, 5, 20])
def test_the_jittered_pause_lies_in_the_upper_half_of_its_bound(attempt: int) -> None:
    policy = RetryPolicy(retries=MAX_RETRIES, backoff=0.25)
    bound = retry_pause_bound(attempt, 0.25)

    assert policy.pause(attempt, rng=lambda: 0.0) == bound / 2
    assert policy.pause(attempt, rng=lambda: 0.999999) == pytest.approx(bound, rel=1e-5)
    assert all(bound / 2 <= policy.pause(attempt) <= bound for _ in range(200))
    assert len({policy.pause(attempt) for _ in range(20)}) > 1  # jittered, not fixed


def test_the_longest_run_of_a_call_counts_every_attempt_and_the_longest_pauses() -> None:
    spec = ToolSpec(
        name="t", description="", parameters={}, hard_timeout=2.0, retries=3, retry_backoff=0.5
    )

    assert spec.longest_run() == 2.0 * 4 + 0.5 + 1.0 + 2.0
    assert spec.model_copy(update={"retries": 0}).longest_run() == 2.0
    assert spec.model_copy(update={"hard_timeout": None}).longest_run() is None


# -- the deadline ------------------------------------------------------------------------


class Clocks:
    """A monotonic clock and a shared clock that the test moves together."""

    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t

    def shared(self) -> float:
        return self.t


def _attempts(
    clocks: Clocks, *, deadline: float | None, hard_timeout: float | None = None, retries: int = 5
) -> Attempts:
    policy = RetryPolicy(retries=retries, retry_on=(ConnectionError,), backoff=1.0)
    call = CallRequest(call_id="c", tool="t", deadline=deadline)
    return Attempts(
        policy,
        call=call,
        hard_timeout=hard_timeout,
        clock=clocks.monotonic,
        now=clocks.shared,
        rng=lambda: 1.0,
    )


def test_another_attempt_starts_only_if_the_pause_and_the_last_attempts_duration_fit_before_the_deadline() -> (  # noqa: E501
    None
):
    clocks = Clocks()
    attempts = _attempts(clocks, deadline=1000.0 + 10.0)

    attempts.start()
    clocks.t += 3.0  # the first attempt took 3 s: pause 1 s + 3 s ends at 1007 s
    assert attempts.pause_after(ConnectionError()) == 1.0
    clocks.t += 1.0
    attempts.start()
    clocks.t += 3.0  # now at 1007 s: pause 2 s + 3 s would end at 1012 s, past the deadline
    assert attempts.pause_after(ConnectionError()) is None


def test_with_a_hard_limit_another_attempt_needs_the_whole_limit_before_the_deadline() -> None:
    clocks = Clocks()
    attempts = _attempts(clocks, deadline=1000.0 + 5.0, hard_timeout=4.5)

    attempts.start()
    clocks.t += 0.01  # a fast failure; but the next attempt may run 4.5 s: 1 + 4.5 > 5 - 0.01
    assert attempts.pause_after(ConnectionError()) is None


def test_without_a_deadline_only_the_count_of_retries_stops_them() -> None:
    clocks = Clocks()
    attempts = _attempts(clocks, deadline=None, retries=2)
    pauses = []
    for _ in range(3):
        attempts.start()
        clocks.t += 100.0
        pauses.append(attempts.pause_after(ConnectionError()))

    assert pauses == [1.0, 2.0, None]


def test_an_exception_the_policy_does_not_list_is_never_retried() -> None:
    attempts = _attempts(Clocks(), deadline=None)
    attempts.start()

    assert attempts.pause_after(ValueError()) is None


def test_a_cancelled_call_is_never_retried() -> None:
    policy = RetryPolicy(retries=5, retry_on=(ConnectionError,), backoff=0.0)
    attempts = Attempts(
        policy, call=CallRequest(call_id="c", tool="t"), hard_timeout=None, cancelled=lambda: True
    )
    attempts.start()

    assert attempts.pause_after(ConnectionError()) is None


# -- running the attempts (executor.runner) ------------------------------------------------


def test_a_tool_that_fails_twice_then_succeeds_returns_its_result_after_three_runs(
    register: Register,
) -> None:
    flaky, runs = _failing(2)
    name = register(flaky, retries=3, retry_on=ConnectionError, retry_backoff=0)

    outcome = execute(_request(name))

    assert (outcome.ok, outcome.result, len(runs)) == (True, "done", 3)


def test_the_last_error_carries_the_number_of_attempts(register: Register) -> None:
    flaky, runs = _failing(10)
    name = register(flaky, retries=2, retry_on=ConnectionError, retry_backoff=0)

    outcome = execute(_request(name))

    assert outcome.error is not None
    assert (outcome.error.type, outcome.error.message, outcome.error.attempts, len(runs)) == (
        "ConnectionError",
        "down (3)",
        3,
        3,
    )


def test_an_at_most_once_tool_retries_only_the_exceptions_it_lists(register: Register) -> None:
    flaky, runs = _failing(1, exc=ValueError)
    name = register(flaky, retries=3, retry_on=ConnectionError, retry_backoff=0)

    outcome = execute(_request(name))

    assert outcome.error is not None
    assert (outcome.error.type, outcome.error.attempts, len(runs)) == ("ValueError", 1, 1)


def test_a_subclass_of_a_listed_exception_is_retried(register: Register) -> None:
    flaky, runs = _failing(1, exc=ConnectionRefusedError)
    name = register(flaky, retries=1, retry_on=OSError, retry_backoff=0)

    assert execute(_request(name)).ok and len(runs) == 2


def test_a_hard_timeout_is_never_retried(register: Register) -> None:
    runs: list[int] = []

    async def slow() -> None:
        runs.append(1)
        await asyncio.sleep(5)

    name = register(slow, retries=3, idempotent=True, hard_timeout=0.05, retry_backoff=0)

    outcome = execute(_request(name))

    assert outcome.error is not None
    assert (outcome.error.kind, outcome.error.attempts, len(runs)) == (ErrorKind.HARD_TIMEOUT, 1, 1)


def test_a_tool_that_calls_sys_exit_is_not_retried_even_when_it_retries_everything(
    register: Register,
) -> None:
    runs: list[int] = []

    def leaves() -> None:
        runs.append(1)
        sys.exit(3)

    name = register(leaves, retries=3, idempotent=True, retry_backoff=0)

    outcome = execute(_request(name))

    assert outcome.error is not None and outcome.error.type == "SystemExit"
    assert len(runs) == 1


def test_invalid_arguments_never_run_so_are_never_retried(register: Register) -> None:
    runs: list[int] = []

    def counted(n: int) -> int:
        runs.append(1)
        return n

    name = register(counted, retries=3, idempotent=True, retry_backoff=0)

    outcome = execute(_request(name, n="not a number"))

    assert outcome.error is not None and outcome.error.kind is ErrorKind.INVALID_ARGUMENTS
    assert runs == []


def test_a_pause_that_would_pass_the_deadline_ends_the_call_at_once_with_the_last_error(
    register: Register,
) -> None:
    flaky, runs = _failing(10)
    name = register(flaky, retries=5, retry_on=ConnectionError, retry_backoff=30)

    outcome = execute(_request(name, deadline=shared_now() + 10))

    assert outcome.error is not None
    assert (outcome.error.type, outcome.error.attempts, len(runs)) == ("ConnectionError", 1, 1)


def test_the_asyncio_pools_runner_retries_too_and_pauses_on_the_loop(register: Register) -> None:
    runs: list[int] = []

    async def flaky() -> str:
        runs.append(1)
        if len(runs) < 3:
            raise ConnectionError("down")
        return "done"

    name = register(flaky, retries=2, retry_on=ConnectionError, retry_backoff=0.02)

    async def main() -> tuple[CallOutcome, int]:
        ticks = itertools.count()
        beating = True

        async def beat() -> None:  # the loop stays free while the call pauses
            while beating:
                next(ticks)
                await asyncio.sleep(0.001)

        beater = asyncio.ensure_future(beat())
        outcome = await execute_async(_request(name))
        beating = False
        await beater
        return outcome, next(ticks)

    outcome, ticks = asyncio.run(main())

    assert (outcome.ok, outcome.result, len(runs)) == (True, "done", 3)
    assert ticks >= 5


def test_a_retry_is_counted_for_toolexec_status_beside_the_outcome(register: Register) -> None:
    stats.flush_into(_NullPipe())
    flaky, _ = _failing(2)
    name = register(flaky, retries=2, retry_on=ConnectionError, retry_backoff=0)

    execute(_request(name))

    counted = {field: n for fields in stats.pending().values() for field, n in fields.items()}
    assert counted == {f"retry:{name}": 2}  # the outcome is counted when it is delivered


def test_status_reads_retries_apart_from_the_outcomes() -> None:
    now = 10_000.0
    fake = FakeRedis(
        {keys.stats("10:10000"): {b"ok:book": b"2", b"execution:book": b"1", b"retry:book": b"4"}}
    )

    counts = stats.read_counts(fake, now)["last_minute"]["book"]  # type: ignore[arg-type]

    assert (counts.done, counts.failed, counts.timed_out, counts.retries) == (2, 1, 0, 4)
    assert counts.as_dict() == {
        "done": 2,
        "failed": 1,
        "timed_out": 0,
        "by_kind": {"execution": 1, "ok": 2},
        "retries": 4,
    }
    assert _counts(counts.as_dict()) == "2 / 1 / 0 (4 retries)"
    assert _counts({**counts.as_dict(), "retries": 0}) == "2 / 1 / 0"


class _NullPipe:
    def hincrby(self, key: str, field: str, amount: int) -> None:
        pass

    def expire(self, key: str, seconds: int) -> None:
        pass


# -- the error on the agent's side -------------------------------------------------------


def test_an_error_from_an_older_worker_counts_one_attempt() -> None:
    info = ErrorInfo.model_validate({"kind": "execution", "type": "ValueError", "message": "m"})

    assert info.attempts == 1


def test_the_callers_error_names_the_attempts_and_keeps_the_remote_message() -> None:
    outcome = CallOutcome.failure("c", ErrorKind.EXECUTION, "ConnectionError", "down")
    stamped = outcome.model_copy(update={"error": outcome.error.model_copy(update={"attempts": 3})})  # type: ignore[union-attr]

    with pytest.raises(ToolExecutionError) as info:
        result_of("book", CallOutcome.model_validate_json(stamped.model_dump_json()))

    assert (info.value.attempts, info.value.remote_message) == (3, "down")
    assert str(info.value) == "tool 'book' failed: ConnectionError: down (after 3 attempts)"
    assert (
        str(ToolExecutionError("book", "ValueError", "bad"))
        == "tool 'book' failed: ValueError: bad"
    )
    assert ToolExecutionError("book", "ValueError", "bad").attempts == 1
