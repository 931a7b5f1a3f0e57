"""The process-local memory of stored outcomes: bounded, expiring, exact."""

from __future__ import annotations

import time

import pytest

from agent_client.runs import StoredOutcomes
from wire.models import CallOutcome


def outcome(n: int) -> CallOutcome:
    return CallOutcome.success(f"call-{n}", {"n": n})


def test_a_remembered_outcome_comes_back_unchanged() -> None:
    stored = StoredOutcomes(ttl=60)
    stored.put("k", outcome(1))
    assert stored.get("k") == outcome(1)
    assert stored.get("other") is None


def test_an_outcome_is_forgotten_after_the_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    stored = StoredOutcomes(ttl=10)
    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now)
    stored.put("k", outcome(1))
    monkeypatch.setattr(time, "monotonic", lambda: now + 10.5)
    assert stored.get("k") is None
    assert len(stored) == 0


def test_the_least_recently_used_outcome_goes_first_when_full() -> None:
    stored = StoredOutcomes(ttl=60, max_entries=2)
    stored.put("a", outcome(1))
    stored.put("b", outcome(2))
    assert stored.get("a") is not None  # a is now the most recently used
    stored.put("c", outcome(3))
    assert stored.get("b") is None
    assert stored.get("a") == outcome(1) and stored.get("c") == outcome(3)
