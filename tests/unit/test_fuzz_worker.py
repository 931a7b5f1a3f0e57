"""Fuzzing the worker's argument check of every starter tool, as a forged message would.

A worker must not trust the client's check: anything JSON can decode to may arrive
(kombu's JSON reads NaN and Infinity, and ``"\\ud800"`` decodes to a lone surrogate).
:func:`executor.runner.execute` gets each, with the tool's real argument model and a
stand-in body that returns what it was given (a starter tool may book a flight or
sleep ten minutes), and must answer with an outcome: INVALID_ARGUMENTS with a short
message naming the field for anything that does not fit; for anything it takes, the
values the tool received fit the tool's published schema (the worker coerces ``"5"``
to 5.0, by design, never into something the schema refuses). Never an exception.

``test_fuzz_message_path.py`` sends a sample of the same cases as forged queue items
through kombu's decoding, the way a worker reads them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executor.outcomes import encode_outcome
from executor.registry import ToolDefinition
from executor.runner import execute
from tests.unit.fuzz_strategies import (
    CATEGORIES,
    STARTER_TOOLS,
    assert_schema_valid_json,
    field_named,
    mixed_arguments,
    starter,
    valid_arguments,
)
from wire.models import CallOutcome, CallRequest, ErrorKind

MAX_MESSAGE = 2_000
_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=_HEALTH)
PER_CASE = settings(max_examples=12, deadline=None, suppress_health_check=_HEALTH)


def _echo(**kwargs: Any) -> dict[str, Any]:
    """Stands in for the tool: returns what it was given."""
    return kwargs


@functools.cache
def stand_in(name: str) -> ToolDefinition:
    """The starter tool's definition (its spec and argument model) with a harmless body."""
    return dataclasses.replace(starter(name), func=_echo, is_async=False)


def run(tool: str, arguments: dict[str, Any]) -> CallOutcome:
    """The outcome of a call, checked to be one any client can read."""
    outcome = execute(
        CallRequest(call_id="c", tool=tool, arguments=arguments),
        worker="w",
        definition=stand_in(tool),
    )
    encoded = encode_outcome(outcome, tool=tool, max_bytes=4_194_304)
    assert CallOutcome.model_validate_json(encoded.encode("utf-8")).call_id == "c"
    return outcome


def refusal(outcome: CallOutcome) -> str:
    """The message of an INVALID_ARGUMENTS outcome: short, valid Unicode, no traceback."""
    assert outcome.error is not None, f"accepted: {outcome.result!r:.200}"
    assert outcome.error.kind is ErrorKind.INVALID_ARGUMENTS, outcome.error
    message = outcome.error.message
    assert len(message) <= MAX_MESSAGE and "Traceback" not in message
    message.encode("utf-8")
    return message


@FUZZ
@given(data=st.data())
def test_the_worker_refuses_clearly_or_hands_the_tool_values_that_fit_its_schema(
    data: st.DataObject,
) -> None:
    tool = data.draw(st.sampled_from(STARTER_TOOLS))
    arguments = data.draw(mixed_arguments(starter(tool)))

    outcome = run(tool, arguments)

    if outcome.ok:
        assert_schema_valid_json(outcome.result, starter(tool))
    else:
        refusal(outcome)


@pytest.mark.parametrize("tool", STARTER_TOOLS)
@FUZZ
@given(data=st.data())
def test_valid_arguments_reach_the_tool_as_they_were_sent(tool: str, data: st.DataObject) -> None:
    arguments = data.draw(valid_arguments(starter(tool)))

    outcome = run(tool, arguments)

    assert outcome.ok and {k: v for k, v in outcome.result.items() if k in arguments} == arguments


@pytest.mark.parametrize("tool", STARTER_TOOLS)
@pytest.mark.parametrize("category", sorted(CATEGORIES))
@PER_CASE
@given(data=st.data())
def test_each_category_of_bad_argument_gets_invalid_arguments_naming_its_field(
    category: str, tool: str, data: st.DataObject
) -> None:
    if category == "missing fields" and not starter(tool).spec.parameters.get("required"):
        # Nothing can be missing: the tool requires no field, and no arguments are valid.
        assert run(tool, {}).ok
        return
    case = CATEGORIES[category](data, starter(tool))

    assert field_named(case.field) in refusal(run(tool, case.arguments))


def test_a_result_that_is_not_valid_unicode_becomes_an_error_the_client_can_read() -> None:
    definition = dataclasses.replace(
        starter("search"), func=lambda **_: {"snippet": "half \ud800"}, is_async=False
    )
    outcome = execute(
        CallRequest(call_id="c", tool="search", arguments={"query": "fox"}), definition=definition
    )

    encoded = encode_outcome(outcome, tool="search", max_bytes=4_194_304)

    decoded = CallOutcome.model_validate_json(encoded.encode("utf-8"))
    assert decoded.error is not None and decoded.error.type == "UnserializableResult"
