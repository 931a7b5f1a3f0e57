from __future__ import annotations

import types

import tasks
from executor import get_tool


def test_tasks_exports_exactly_its_public_names() -> None:
    public = {
        name
        for name, value in vars(tasks).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and name != "annotations"
    }

    assert set(tasks.__all__) == public
    assert len(tasks.__all__) == len(set(tasks.__all__))


def test_importing_tasks_registers_every_tool_with_a_described_schema() -> None:
    for name in ("search", "get_today_date", "book_flight", "slow_report"):
        definition = get_tool(name)
        assert definition is not None, f"{name} is not registered"
        assert definition.func is getattr(tasks, name)
        assert definition.spec.description
        for parameter in definition.spec.parameters["properties"].values():
            assert parameter.get("description"), f"{name} has an undescribed parameter"


def test_book_flight_runs_at_most_once_and_get_today_date_is_idempotent() -> None:
    booking, today = get_tool("book_flight"), get_tool("get_today_date")

    assert booking is not None and today is not None
    assert (booking.spec.idempotent, booking.spec.delivery) == (False, "at_most_once")
    assert today.spec.idempotent
