"""agent_client.runs.check_key: a run id or idempotency key the client would send."""

from __future__ import annotations

from typing import Any

import pytest

from agent_client import run_scope
from agent_client.runs import check_key
from wire.models import MAX_KEY_LENGTH


@pytest.mark.parametrize(
    "value", [123, 1.5, b"run", ["a"], {"a": 1}, "", "k" * (MAX_KEY_LENGTH + 1)]
)
def test_anything_but_a_short_string_is_refused_naming_what_was_checked(value: Any) -> None:
    with pytest.raises(
        ValueError,
        match=(
            r"^idempotency_key must be a non-empty string of at most "
            rf"{MAX_KEY_LENGTH} characters, got "
        ),
    ):
        check_key(value, what="idempotency_key")


def test_a_huge_key_is_described_not_quoted() -> None:
    with pytest.raises(ValueError) as refused:
        check_key("k" * 10_000_000, what="idempotency_key")

    assert str(refused.value).endswith("got a string of 10000000 characters")


@pytest.mark.parametrize("value", [None, "r", "run-42", "k" * MAX_KEY_LENGTH])
def test_none_and_strings_the_wire_carries_pass(value: str | None) -> None:
    assert check_key(value, what="run_id") == value


def test_run_scope_applies_the_same_rule() -> None:
    with pytest.raises(ValueError, match="run_id must be a non-empty string"):
        run_scope(123)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="run_id must be a non-empty string"):
        run_scope("r" * (MAX_KEY_LENGTH + 1))
