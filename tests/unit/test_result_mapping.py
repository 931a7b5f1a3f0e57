"""agent_client.errors.result_of: each outcome becomes a result or the right exception."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from agent_client.errors import (
    CallerGone,
    RemoteToolError,
    ToolArgumentsInvalid,
    ToolCancelled,
    ToolExecutionError,
    ToolNotFound,
    ToolTimeoutError,
    WorkerLost,
    result_of,
)
from executor.outcomes import encode_outcome
from executor.registry import tool, unregister
from executor.runner import execute
from wire.models import CallOutcome, CallRequest, ErrorInfo, ErrorKind


def failure(
    kind: ErrorKind, type_name: str = "Remote", message: str = "it went wrong"
) -> CallOutcome:
    return CallOutcome.failure("call-1", kind, type_name, message, worker="w")


@pytest.mark.parametrize("result", [{"hits": [1, 2]}, "text", 0, [], None])
def test_a_successful_outcome_returns_its_result_even_when_falsy(result: Any) -> None:
    assert result_of("search", CallOutcome.success("call-1", result)) == result


@pytest.mark.parametrize(
    ("kind", "error_class"),
    [
        (ErrorKind.EXECUTION, ToolExecutionError),
        (ErrorKind.INVALID_ARGUMENTS, ToolArgumentsInvalid),
        (ErrorKind.NOT_FOUND, ToolNotFound),
        (ErrorKind.EXPIRED, ToolTimeoutError),
        (ErrorKind.HARD_TIMEOUT, ToolExecutionError),
        (ErrorKind.WORKER_LOST, WorkerLost),
    ],
)
def test_each_error_kind_raises_its_exception_naming_the_tool(
    kind: ErrorKind, error_class: type[Exception]
) -> None:
    with pytest.raises(error_class) as info:
        result_of("search", failure(kind), timeout=2.0)

    assert type(info.value) is error_class
    assert isinstance(info.value, RemoteToolError)
    assert info.value.tool == "search"
    assert "'search'" in str(info.value)


#: The exception each error kind must raise; the test below checks it covers every kind.
EXPECTED_CLASS: dict[ErrorKind, type[RemoteToolError]] = {
    ErrorKind.EXECUTION: ToolExecutionError,
    ErrorKind.INVALID_ARGUMENTS: ToolArgumentsInvalid,
    ErrorKind.NOT_FOUND: ToolNotFound,
    ErrorKind.EXPIRED: ToolTimeoutError,
    ErrorKind.HARD_TIMEOUT: ToolExecutionError,
    ErrorKind.WORKER_LOST: WorkerLost,
    ErrorKind.CANCELLED: ToolCancelled,
}


def test_every_error_kind_raises_exactly_its_own_exception_class() -> None:
    assert set(EXPECTED_CLASS) == set(ErrorKind), "a new ErrorKind needs its exception here"
    raised: dict[ErrorKind, type[BaseException]] = {}
    for kind in ErrorKind:
        with pytest.raises(RemoteToolError) as info:
            result_of("search", failure(kind), timeout=2.0)
        raised[kind] = type(info.value)
    assert raised == EXPECTED_CLASS


@pytest.mark.parametrize(
    "kind", [ErrorKind.EXECUTION, ErrorKind.HARD_TIMEOUT, "kind_from_a_newer_worker"]
)
def test_any_other_error_kind_falls_through_to_an_execution_error_with_the_remote_type_and_message(
    kind: ErrorKind | str,
) -> None:
    # model_construct skips validation: an unknown kind reaches result_of as a newer
    # worker sends it.
    error = ErrorInfo.model_construct(
        kind=kind, type="QuotaExceeded", message="daily quota used up"
    )
    outcome = CallOutcome.model_construct(
        call_id="call-1", ok=False, result=None, error=error, worker="w"
    )

    with pytest.raises(ToolExecutionError) as info:
        result_of("search", outcome, timeout=2.0)

    assert type(info.value) is ToolExecutionError
    assert info.value.tool == "search"
    assert (info.value.remote_type, info.value.remote_message) == (
        "QuotaExceeded",
        "daily quota used up",
    )
    assert str(info.value) == "tool 'search' failed: QuotaExceeded: daily quota used up"


def test_an_execution_error_keeps_the_remote_type_and_message() -> None:
    with pytest.raises(ToolExecutionError) as info:
        result_of("pay", failure(ErrorKind.EXECUTION, "PaymentDeclined", "card declined"))

    assert (info.value.remote_type, info.value.remote_message) == (
        "PaymentDeclined",
        "card declined",
    )
    assert str(info.value) == "tool 'pay' failed: PaymentDeclined: card declined"


def test_a_hard_timeout_is_an_execution_error_of_remote_type_tool_hard_timeout() -> None:
    with pytest.raises(ToolExecutionError) as info:
        result_of(
            "report",
            failure(ErrorKind.HARD_TIMEOUT, "ToolHardTimeout", "ran past its hard limit of 1s"),
        )

    assert info.value.remote_type == "ToolHardTimeout"
    assert "hard limit" in info.value.remote_message


def test_an_expired_call_is_a_timeout_carrying_the_callers_deadline() -> None:
    with pytest.raises(ToolTimeoutError) as info:
        result_of("report", failure(ErrorKind.EXPIRED, "DeadlineExpired"), timeout=2.5)

    assert (info.value.tool, info.value.timeout) == ("report", 2.5)
    assert "by the worker's clock before it started" in str(info.value)


def test_a_call_shed_because_its_caller_was_judged_gone_is_never_told_as_a_timeout() -> None:
    shed = failure(
        ErrorKind.EXPIRED,
        "CallerGone",
        "a worker did not run this call: its caller was judged gone",
    )
    with pytest.raises(CallerGone) as info:
        result_of("report", shed, timeout=8.0)

    assert not isinstance(info.value, ToolTimeoutError)
    assert "timed out" not in str(info.value) and "8s" not in str(info.value)
    assert "'report' was not run: a worker did not run this call" in str(info.value)


def test_invalid_arguments_carry_the_workers_field_naming_message_as_the_problem() -> None:
    with pytest.raises(ToolArgumentsInvalid) as info:
        result_of(
            "search",
            failure(
                ErrorKind.INVALID_ARGUMENTS,
                "ValidationError",
                "limit: Input should be a valid integer",
            ),
        )

    assert info.value.problems == ("limit: Input should be a valid integer",)


def test_not_found_carries_the_workers_reason() -> None:
    with pytest.raises(ToolNotFound, match="no tool named 'search' is registered on worker w"):
        result_of(
            "search",
            failure(
                ErrorKind.NOT_FOUND,
                "ToolNotFound",
                "no tool named 'search' is registered on worker w",
            ),
        )


def test_worker_lost_carries_the_message() -> None:
    with pytest.raises(WorkerLost, match="process 123 exited"):
        result_of("search", failure(ErrorKind.WORKER_LOST, "WorkerLost", "process 123 exited"))


def test_a_failed_outcome_without_an_error_is_still_an_error() -> None:
    with pytest.raises(RemoteToolError, match="failed without an error description"):
        result_of("search", CallOutcome(call_id="c", ok=False))


def test_a_worker_side_exception_reaches_the_caller_through_json_as_an_execution_error() -> None:
    def divide(a: int, b: int) -> float:
        """Divide a by b."""
        return a / b

    name = f"t_{uuid.uuid4().hex[:12]}"
    tool(name=name)(divide)
    try:
        outcome = execute(CallRequest(call_id="c", tool=name, arguments={"a": 1, "b": 0}))
    finally:
        unregister(name)
    wire = encode_outcome(outcome, tool=name, max_bytes=10_000)

    with pytest.raises(ToolExecutionError) as info:
        result_of(name, CallOutcome.model_validate_json(wire))

    assert (info.value.remote_type, info.value.remote_message) == (
        "ZeroDivisionError",
        "division by zero",
    )
