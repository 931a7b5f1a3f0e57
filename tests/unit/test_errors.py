"""agent_client.errors and executor.errors: one error tree per side, drawn in its docstring."""

from __future__ import annotations

import builtins
import re
from types import ModuleType

import pytest

import agent_client
import executor
import toolexec
import wire
from agent_client import errors as agent_errors
from agent_client.errors import (
    BrokerUnavailable,
    RemoteToolError,
    ToolArgumentsInvalid,
    ToolExecutionError,
    ToolNotFound,
    ToolTimeoutError,
    WorkerLost,
)
from executor import errors as worker_errors
from toolexec import errors as ops_errors
from wire import errors as wire_errors
from wire.errors import ToolexecError


def classes_of(module: ModuleType) -> list[type[BaseException]]:
    return [getattr(module, name) for name in module.__all__]


def test_every_agent_error_is_a_remote_tool_error_and_so_a_toolexec_error() -> None:
    for error in classes_of(agent_errors):
        assert issubclass(error, RemoteToolError), error
        assert issubclass(error, ToolexecError), error


def test_every_worker_error_is_a_toolexec_error() -> None:
    for error in classes_of(worker_errors):
        assert issubclass(error, ToolexecError), error


def test_every_wire_and_ops_error_is_a_toolexec_error() -> None:
    for error in [*classes_of(wire_errors), *classes_of(ops_errors)]:
        assert issubclass(error, ToolexecError), error


@pytest.mark.parametrize(
    "module", [agent_errors, worker_errors, wire_errors], ids=lambda m: m.__name__
)
def test_no_error_shadows_a_builtin_name(module: ModuleType) -> None:
    assert not set(module.__all__) & set(dir(builtins))


@pytest.mark.parametrize(
    ("module", "root", "homes"),
    [
        (agent_errors, ToolexecError, [agent_errors, wire_errors]),
        (wire_errors, ToolexecError, [wire_errors]),
        (worker_errors, ToolexecError, [worker_errors, wire_errors]),
        (ops_errors, ToolexecError, [ops_errors, wire_errors]),
    ],
    ids=["agent_client", "wire", "executor", "toolexec"],
)
def test_the_docstring_draws_the_whole_error_tree(
    module: ModuleType, root: type, homes: list[ModuleType]
) -> None:
    tree = module.__doc__.split("```")[1]  # type: ignore[union-attr]
    drawn = re.findall(r"^[│├└─\s]*([A-Z]\w+)", tree, re.MULTILINE)

    assert set(module.__all__) <= set(drawn)
    for name in drawn:
        found = [getattr(home, name) for home in homes if hasattr(home, name)]
        assert found and issubclass(found[0], root), f"{name} is drawn but is not a {root.__name__}"


@pytest.mark.parametrize(
    ("package", "module"),
    [
        (agent_client, agent_errors),
        (executor, worker_errors),
        (wire, wire_errors),
        (toolexec, ops_errors),
    ],
)
def test_every_error_is_exported_by_its_package(package: ModuleType, module: ModuleType) -> None:
    assert set(module.__all__) <= set(package.__all__)


def test_tool_not_found_lists_the_available_tools_sorted() -> None:
    error = ToolNotFound("serch", ["search", "book_flight"])

    assert error.tool == "serch"
    assert error.available == ("book_flight", "search")
    assert str(error) == (
        "tool 'serch' is not available: no live worker serves it. Available tools: "
        "book_flight, search"
    )


def test_tool_not_found_says_so_when_nothing_is_available_and_keeps_a_reason() -> None:
    error = ToolNotFound("search", reason="no worker has published it")

    assert (
        str(error)
        == "tool 'search' is not available: no worker has published it. Available tools: none"
    )


def test_tool_timeout_error_has_the_tool_and_the_timeout() -> None:
    error = ToolTimeoutError("slow_report", 2.5)

    assert (error.tool, error.timeout) == ("slow_report", 2.5)
    assert str(error) == "tool 'slow_report' timed out after 2.5s"


def test_tool_execution_error_keeps_the_remote_type_and_message() -> None:
    error = ToolExecutionError("pay", "PaymentDeclined", "card declined")

    assert (error.tool, error.remote_type, error.remote_message) == (
        "pay",
        "PaymentDeclined",
        "card declined",
    )


def test_tool_arguments_invalid_joins_its_problems() -> None:
    error = ToolArgumentsInvalid("search", ["limit: too big", "query: missing"])

    assert error.problems == ("limit: too big", "query: missing")
    assert str(error) == "invalid arguments for tool 'search': limit: too big; query: missing"


def test_errors_that_concern_no_single_tool_have_no_tool() -> None:
    assert BrokerUnavailable("redis is down").tool is None
    assert WorkerLost("gone", tool="search").tool == "search"
