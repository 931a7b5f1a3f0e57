"""Arguments, results and error messages stay out of INFO logs."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from executor.registry import tool, unregister
from executor.runner import execute
from wire.models import CallRequest

SECRET = "4111-1111-1111-1111"


@pytest.fixture
def leaky_tools() -> Iterator[None]:
    @tool(name="log_probe_ok")
    def ok(card: str) -> dict[str, str]:
        """Return the card."""
        return {"card": card}

    @tool(name="log_probe_fail")
    def fail(card: str) -> None:
        """Fail with the card in the message."""
        raise ValueError(f"card {card} declined")

    yield
    unregister("log_probe_ok")
    unregister("log_probe_fail")


@pytest.mark.parametrize("name", ["log_probe_ok", "log_probe_fail"])
def test_a_call_logs_nothing_of_its_arguments_result_or_error_message_at_info(
    name: str, leaky_tools: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    outcome = execute(CallRequest(call_id="c1", tool=name, arguments={"card": SECRET}))

    assert SECRET in outcome.model_dump_json()  # the caller gets it...
    info = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert not any(SECRET in line for line in info)  # ...the log does not


def test_invalid_arguments_are_not_logged_at_info(
    leaky_tools: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    execute(
        CallRequest(call_id="c2", tool="log_probe_ok", arguments={"card": SECRET, "extra": SECRET})
    )

    assert not any(SECRET in r.getMessage() for r in caplog.records if r.levelno >= logging.INFO)
