"""executor.runner: one call of a tool becomes a CallOutcome, whatever the tool does."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from executor import limits, runner
from executor.context import CallContext, current_call
from executor.outcomes import encode_outcome
from executor.registry import tool, unregister
from executor.runner import execute
from wire.clock import shared_now
from wire.models import CallOutcome, CallRequest, ErrorKind

Register = Callable[..., str]


@pytest.fixture
def register() -> Iterator[Register]:
    """Register ``func`` under a fresh name with ``options``; unregistered after the test."""
    names: list[str] = []

    def _register(func: Callable[..., Any], **options: Any) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        tool(name=name, **options)(func)
        names.append(name)
        return name

    yield _register
    for name in names:
        unregister(name)


def call(name: str, /, deadline: float | None = None, **arguments: Any) -> CallOutcome:
    return execute(
        CallRequest(
            call_id="call-1", tool=name, arguments=arguments, deadline=deadline, run_id="run-1"
        ),
        worker="worker@host",
    )


class PaymentDeclined(Exception):
    pass


class Flight(BaseModel):
    code: str
    departs: datetime.datetime


@dataclasses.dataclass
class Seat:
    row: int
    letter: str


# -- results ---------------------------------------------------------------------------


def test_a_sync_tool_returns_its_result_with_the_call_id_and_worker(register: Register) -> None:
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    outcome = call(register(add), a=2, b=3)

    assert outcome == CallOutcome(call_id="call-1", ok=True, result=5, worker="worker@host")


def test_an_async_tool_is_awaited(register: Register) -> None:
    async def add(a: int, b: int) -> int:
        """Add."""
        await asyncio.sleep(0)
        return a + b

    assert call(register(add), a=2, b=3).result == 5


def test_arguments_are_coerced_by_pydantic_before_the_tool_sees_them(register: Register) -> None:
    seen: list[Any] = []

    def double(n: int, seat: Seat | None = None) -> int:
        """Double."""
        seen.extend([n, seat])
        return n * 2

    outcome = call(register(double), n="5", seat={"row": "12", "letter": "C"})

    assert outcome.result == 10
    assert seen == [5, Seat(row=12, letter="C")]


def test_defaults_fill_in_missing_optional_arguments(register: Register) -> None:
    def greet(name: str, greeting: str = "Hello") -> str:
        """Greet."""
        return f"{greeting}, {name}"

    assert call(register(greet), name="Ada").result == "Hello, Ada"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (
            Flight(code="BA1", departs=datetime.datetime(2025, 5, 1, 9, 30)),
            {"code": "BA1", "departs": "2025-05-01T09:30:00"},
        ),
        (Seat(row=3, letter="A"), {"row": 3, "letter": "A"}),
        (datetime.date(2025, 5, 1), "2025-05-01"),
        (
            {
                "seats": [Seat(row=1, letter="B")],
                "when": datetime.datetime(2025, 1, 2, tzinfo=datetime.UTC),
            },
            {"seats": [{"row": 1, "letter": "B"}], "when": "2025-01-02T00:00:00Z"},
        ),
        ((1, "two"), [1, "two"]),
        (None, None),
    ],
    ids=["pydantic-model", "dataclass", "date", "nested", "tuple", "none"],
)
def test_return_values_become_json(register: Register, value: Any, expected: Any) -> None:
    def produce() -> Any:
        """Produce a value."""
        return value

    outcome = call(register(produce))

    assert outcome.ok and outcome.result == expected
    assert json.loads(outcome.model_dump_json())["result"] == expected


@pytest.mark.parametrize("value", [object(), threading.Lock()], ids=["object", "lock"])
def test_a_return_value_json_cannot_carry_is_a_clear_error(register: Register, value: Any) -> None:
    def produce() -> Any:
        """Produce a value."""
        return value

    name = register(produce)
    outcome = call(name)

    assert outcome.error is not None
    assert (outcome.error.kind, outcome.error.type) == (ErrorKind.EXECUTION, "UnserializableResult")
    assert (
        f"tool {name!r} returned a {type(value).__qualname__}, which cannot be sent as JSON"
        in outcome.error.message
    )


def test_a_circular_return_value_is_an_error_outcome_not_a_crash(register: Register) -> None:
    def loop() -> list[Any]:
        """Return a list that contains itself."""
        looped: list[Any] = []
        looped.append(looped)
        return looped

    outcome = call(register(loop))

    assert outcome.error is not None and outcome.error.type == "UnserializableResult"


# -- failures --------------------------------------------------------------------------


def test_invalid_arguments_are_refused_naming_the_field_and_the_tool_does_not_run(
    register: Register,
) -> None:
    ran: list[int] = []

    def double(n: int) -> int:
        """Double."""
        ran.append(n)
        return n * 2

    outcome = call(register(double), n="five")

    assert outcome.error is not None
    assert outcome.error.kind is ErrorKind.INVALID_ARGUMENTS
    assert outcome.error.message.startswith("n: Input should be a valid integer")
    assert ran == []


def test_missing_and_unexpected_arguments_are_each_named(register: Register) -> None:
    def double(n: int) -> int:
        """Double."""
        return n * 2

    outcome = call(register(double), m=1)

    assert outcome.error is not None
    assert "n: Field required" in outcome.error.message
    assert "m: Extra inputs are not permitted" in outcome.error.message


def test_a_nested_invalid_argument_is_named_by_its_path(register: Register) -> None:
    def book(seat: Seat) -> str:
        """Book a seat."""
        return "ok"

    outcome = call(register(book), seat={"row": "front", "letter": "A"})

    assert outcome.error is not None and outcome.error.message.startswith(
        "seat.row: Input should be a valid integer"
    )


def test_an_unknown_tool_is_not_found_naming_the_worker() -> None:
    outcome = call(f"missing_{uuid.uuid4().hex}")

    assert outcome.error is not None
    assert outcome.error.kind is ErrorKind.NOT_FOUND
    assert "is registered on worker worker@host" in outcome.error.message


def test_an_expired_call_is_refused_with_an_expired_outcome() -> None:
    request = CallRequest(call_id="c-1", tool="anything", deadline=time.time() - 0.01)

    outcome = runner.refuse_if_expired(request, worker="worker@host")

    assert outcome is not None and outcome.error is not None
    assert (outcome.error.kind, outcome.error.type) == (ErrorKind.EXPIRED, "DeadlineExpired")
    assert (outcome.call_id, outcome.worker) == ("c-1", "worker@host")


def test_a_call_with_time_left_or_no_deadline_is_not_refused() -> None:
    assert (
        runner.refuse_if_expired(CallRequest(call_id="c-1", tool="t", deadline=time.time() + 30))
        is None
    )
    assert runner.refuse_if_expired(CallRequest(call_id="c-1", tool="t", deadline=None)) is None


def test_the_deadline_is_compared_with_the_clock_given() -> None:
    request = CallRequest(call_id="c-1", tool="t", deadline=100.0)

    assert runner.refuse_if_expired(request, now=99.9) is None
    assert runner.refuse_if_expired(request, now=100.0) is not None


def test_a_call_with_time_left_runs(register: Register) -> None:
    def one() -> int:
        """One."""
        return 1

    assert call(register(one), deadline=time.time() + 30).result == 1


def test_an_exception_becomes_data_with_the_remote_type_name_and_message(
    register: Register,
) -> None:
    def pay(amount: int) -> None:
        """Pay."""
        raise PaymentDeclined(f"card declined for {amount}")

    outcome = call(register(pay), amount=12)

    assert outcome.ok is False and outcome.result is None
    assert outcome.error is not None
    assert (outcome.error.kind, outcome.error.type, outcome.error.message) == (
        ErrorKind.EXECUTION,
        "PaymentDeclined",
        "card declined for 12",
    )


def test_an_async_tool_exception_becomes_data(register: Register) -> None:
    async def fail() -> None:
        """Fail."""
        raise KeyError("gone")

    outcome = call(register(fail))

    assert outcome.error is not None and (outcome.error.type, outcome.error.message) == (
        "KeyError",
        "'gone'",
    )


@pytest.mark.parametrize("hard_timeout", [None, 5.0])
def test_an_async_tools_own_timeout_error_is_an_execution_error_not_a_hard_timeout(
    register: Register, hard_timeout: float | None
) -> None:
    async def upstream() -> None:
        """Call a slow upstream."""
        raise TimeoutError("upstream took too long")

    outcome = call(register(upstream, hard_timeout=hard_timeout))

    assert outcome.error is not None
    assert (outcome.error.kind, outcome.error.type, outcome.error.message) == (
        ErrorKind.EXECUTION,
        "TimeoutError",
        "upstream took too long",
    )


def test_a_sync_tool_past_its_hard_limit_is_abandoned_and_reported(register: Register) -> None:
    release, finished = threading.Event(), threading.Event()

    def stuck() -> str:
        """Wait until released."""
        release.wait(5)
        finished.set()
        return "late"

    name = register(stuck, hard_timeout=0.1)
    started = time.monotonic()
    try:
        outcome = call(name)
        elapsed = time.monotonic() - started
    finally:
        release.set()  # let the abandoned thread end
    finished.wait(5)

    assert outcome.error is not None
    assert (outcome.error.kind, outcome.error.type) == (ErrorKind.HARD_TIMEOUT, "ToolHardTimeout")
    assert f"tool {name!r} ran past its hard limit of 0.1s" in outcome.error.message
    assert elapsed < 1.0


def test_a_sync_tool_within_its_hard_limit_returns_normally_and_its_errors_pass_through(
    register: Register,
) -> None:
    def quick(fail: bool) -> str:
        """Return or fail at once."""
        if fail:
            raise ValueError("bad input")
        return "done"

    name = register(quick, hard_timeout=5)

    assert call(name, fail=False).result == "done"
    failed = call(name, fail=True).error
    assert failed is not None and (failed.kind, failed.type) == (ErrorKind.EXECUTION, "ValueError")


def test_the_loop_a_thread_ran_async_tools_on_is_closed_when_the_thread_ends(
    register: Register,
) -> None:
    async def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    name = register(add)
    seen: list[tuple[CallOutcome, asyncio.AbstractEventLoop]] = []

    def worker_thread() -> None:
        seen.append((call(name, a=1, b=2), limits._loops.loop))

    thread = threading.Thread(target=worker_thread)
    thread.start()
    thread.join()
    del thread  # the thread's locals go with it

    outcome, loop = seen[0]
    assert outcome.result == 3
    assert loop.is_closed()  # closed by its thread's end, not found open by the collector


def test_an_async_tool_past_its_hard_limit_is_cancelled_and_reported(register: Register) -> None:
    cancelled: list[bool] = []

    async def slow() -> str:
        """Sleep."""
        try:
            await asyncio.sleep(2)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "late"

    started = time.monotonic()
    outcome = call(register(slow, hard_timeout=0.1))

    assert outcome.error is not None and outcome.error.kind is ErrorKind.HARD_TIMEOUT
    assert time.monotonic() - started < 1.0
    assert cancelled == [True]


# -- the call context ------------------------------------------------------------------


def _context_of_current_call() -> dict[str, Any]:
    context = current_call()
    return {
        "call_id": context.call_id,
        "run_id": context.run_id,
        "tool": context.tool,
        "idempotency_key": context.idempotency_key,
        "deadline": context.deadline,
        "time_left": context.time_left(),
    }


@pytest.mark.parametrize("kind", ["sync", "async", "sync-with-hard-limit"])
def test_current_call_inside_a_tool_describes_the_call(register: Register, kind: str) -> None:
    def sync_tool() -> dict[str, Any]:
        """Report the context."""
        return _context_of_current_call()

    async def async_tool() -> dict[str, Any]:
        """Report the context."""
        return _context_of_current_call()

    func = async_tool if kind == "async" else sync_tool
    name = register(
        func, hard_timeout=5 if kind == "sync-with-hard-limit" else None, idempotent=True
    )
    deadline = shared_now() + 30  # the clock time_left() counts by
    request = CallRequest(
        call_id="c-9", tool=name, deadline=deadline, run_id="run-7", idempotency_key="key-3"
    )

    outcome = execute(request)

    assert outcome.ok, outcome.error
    seen = outcome.result
    assert (
        seen["call_id"],
        seen["run_id"],
        seen["tool"],
        seen["idempotency_key"],
        seen["deadline"],
    ) == (
        "c-9",
        "run-7",
        name,
        "key-3",
        deadline,
    )
    assert 25 < seen["time_left"] <= 30


def test_current_call_outside_a_tool_raises_lookup_error() -> None:
    with pytest.raises(
        LookupError, match=r"current_call\(\) is only available while a worker runs a tool"
    ):
        current_call()


def test_current_call_is_gone_after_the_tool_returns(register: Register) -> None:
    def noop() -> None:
        """Nothing."""

    call(register(noop))

    with pytest.raises(LookupError):
        current_call()


def test_time_left_is_none_without_a_deadline_and_never_negative() -> None:
    common: dict[str, Any] = {"call_id": "c", "run_id": None, "tool": "t", "idempotency_key": None}

    assert CallContext(deadline=None, **common).time_left() is None
    assert CallContext(deadline=time.time() - 10, **common).time_left() == 0.0


# -- encoding the outcome ----------------------------------------------------------------


def test_an_outcome_within_the_limit_is_encoded_as_is() -> None:
    outcome = CallOutcome.success("c", {"hits": ["a", "b"]}, worker="w")

    encoded = encode_outcome(outcome, tool="search", max_bytes=1000)

    assert CallOutcome.model_validate_json(encoded) == outcome


def test_an_oversized_outcome_is_replaced_by_a_result_too_large_error() -> None:
    outcome = CallOutcome.success("c", "x" * 5000, worker="w")

    decoded = CallOutcome.model_validate_json(
        encode_outcome(outcome, tool="search", max_bytes=1000)
    )

    assert (decoded.call_id, decoded.ok, decoded.worker, decoded.result) == ("c", False, "w", None)
    assert decoded.error is not None
    assert (decoded.error.kind, decoded.error.type) == (ErrorKind.EXECUTION, "ResultTooLarge")
    assert "tool 'search' returned" in decoded.error.message
    assert "the limit is 1000 (TOOLEXEC_MAX_RESULT_BYTES)" in decoded.error.message


def test_the_result_limit_counts_bytes_not_characters() -> None:
    outcome = CallOutcome.success("c", "é" * 100)  # 2 bytes per character in UTF-8
    characters = len(outcome.model_dump_json())

    encoded = encode_outcome(outcome, tool="t", max_bytes=characters + 10)

    assert CallOutcome.model_validate_json(encoded).error is not None


def test_a_bytes_result_is_sent_as_utf8_text(register: Register) -> None:
    def raw() -> dict[str, bytes]:
        """Raw."""
        return {"body": "café".encode()}

    assert call(register(raw)).result == {"body": "café"}


def test_bytes_that_are_not_utf8_are_refused_with_a_message_that_says_what_to_do(
    register: Register,
) -> None:
    def binary() -> dict[str, bytes]:
        """Binary."""
        return {"png": b"\x89PNG\xff\xfe"}

    outcome = call(register(binary))

    assert outcome.error is not None
    assert (outcome.error.kind, outcome.error.type) == (ErrorKind.EXECUTION, "UnserializableResult")
    assert "not UTF-8" in outcome.error.message and "base64" in outcome.error.message
