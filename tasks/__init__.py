"""toolexec's starter tool catalogue: ``import tasks`` registers every tool in it.

Each tool lives in its own module; its docstring is what the model reads.
"""

from __future__ import annotations

from tasks.dates import get_today_date
from tasks.flights import book_flight, list_bookings
from tasks.fulltext import search
from tasks.reports import slow_report

__all__ = [
    "book_flight",
    "get_today_date",
    "list_bookings",  # a plain function for reading the ledger, not a tool
    "search",
    "slow_report",
]
