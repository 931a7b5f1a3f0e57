"""``toolexec tools`` for people: every field in full, whatever the terminal's width."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from toolexec.commands.render import DESCRIPTION_MIN_WIDTH, tools_view

_DESCRIPTION = "Book one seat on a flight for one passenger, and return the booking reference."


def _rows() -> list[dict[str, Any]]:
    return [
        {
            "name": "book_flight",
            "queue": "bookings",
            "idempotent": True,
            "timeout": 60,
            "timeout_from": "tool",
            "delivery": "at_least_once",
            "workers": ["celery@vm-1234abcd"],
            "description": _DESCRIPTION,
        },
        {
            "name": "search",
            "queue": "default",
            "idempotent": False,
            "timeout": 30,
            "timeout_from": "settings",
            "delivery": "at_most_once",
            "workers": ["celery@vm-1234abcd", "b@vm"],
            "description": "Search the web.",
        },
    ]


def _printed(width: int) -> str:
    out = io.StringIO()
    Console(width=width, file=out).print(tools_view(_rows(), width))
    return out.getvalue()


@pytest.mark.parametrize("width", [40, 60, 80, 100, 120, 200])
def test_every_field_is_printed_whole_at_any_width(width: int) -> None:
    printed = _printed(width)
    words = " ".join(printed.replace("│", " ").split())  # a long line may wrap

    assert "…" not in printed
    assert all(len(line.rstrip()) <= width for line in printed.splitlines())
    for field in ("book_flight", "bookings", "60s", "at least once", "celery@vm-1234abcd",
                  "search", "default", "30s (default)", "at most once", "b@vm"):  # fmt: skip
        assert field in words, f"{field!r} missing at width {width}:\n{printed}"
    for word in _DESCRIPTION.split():  # the description may wrap, but every word is there
        assert word in words


def test_a_wide_terminal_gets_a_table_and_a_narrow_one_a_block_per_tool() -> None:
    wide, narrow = _printed(200), _printed(80)

    assert "┃ tool" in wide and _DESCRIPTION in wide  # one line each at 200 columns
    assert "┃" not in narrow
    assert "queue bookings · idempotent yes · timeout 60s · delivery at least once" in narrow


def test_the_table_is_kept_while_the_description_keeps_its_minimum_width() -> None:
    for width in range(60, 201):
        if "┃" in _printed(width):
            first_table = width
            break
    table = _printed(first_table)
    description_cell = next(line for line in table.splitlines() if "description" in line)
    cell = description_cell.rsplit("┃", 2)[1]

    assert len(cell) >= DESCRIPTION_MIN_WIDTH + 2  # its padding on each side
    assert "┃" not in _printed(first_table - 1)
