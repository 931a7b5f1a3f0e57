"""wire.models.CallRequest: a deadline is a finite number of seconds, or none at all."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest

from wire.models import CallRequest

_FIELDS = {"call_id": "c-1", "tool": "echo", "reply_to": "client-1"}


@pytest.mark.parametrize(
    "deadline", [float("inf"), float("-inf"), float("nan"), True, False, "1796190000", [1]]
)
def test_a_deadline_that_is_not_a_finite_number_is_refused_naming_the_field(deadline: Any) -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        CallRequest.model_validate({**_FIELDS, "deadline": deadline})

    assert [error["loc"][0] for error in info.value.errors()] == ["deadline"]


@pytest.mark.parametrize(
    "text", ['{"deadline": Infinity}', '{"deadline": NaN}', '{"deadline": -Infinity}']
)
def test_a_raw_message_with_a_deadline_of_infinity_or_nan_is_refused(text: str) -> None:
    fields = {**_FIELDS, **json.loads(text)}  # what kombu's JSON decoding hands the worker

    with pytest.raises(pydantic.ValidationError):
        CallRequest.model_validate(fields)


@pytest.mark.parametrize("deadline", [None, 1796190000, 1796190000.25])
def test_a_finite_deadline_or_none_is_kept(deadline: Any) -> None:
    request = CallRequest.model_validate({**_FIELDS, "deadline": deadline})

    assert request.deadline == deadline


@pytest.mark.parametrize("field", ["run_id", "idempotency_key"])
@pytest.mark.parametrize("value", [123, "", "k" * 1025, ["a"], {"a": 1}])
def test_a_run_id_or_key_the_wire_cannot_carry_is_refused_naming_the_field(
    field: str, value: Any
) -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        CallRequest.model_validate({**_FIELDS, field: value})

    assert [error["loc"][0] for error in info.value.errors()] == [field]
