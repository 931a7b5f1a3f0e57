"""The ``get_today_date`` tool: today's date and the dates a model most often needs next.

Models do not know what day it is, and they are unreliable at calendar arithmetic, so
the tool does both: :func:`_dates_for` is the pure calendar part, tested with fixed
dates; the tool only supplies the worker's local date.
"""

from __future__ import annotations

from datetime import date, timedelta
from typing import TypedDict

from executor import tool

__all__ = ["TodayDates", "get_today_date"]

# Not calendar.day_name: that follows the process's locale, and the model is told English.
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


class TodayDates(TypedDict):
    """Today's date and the dates around it, as ISO 8601 strings (YYYY-MM-DD)."""

    today: str
    weekday: str
    tomorrow: str
    next_weekday: dict[str, str]
    one_week_from_today: str
    two_weeks_from_today: str


@tool(idempotent=True)
def get_today_date() -> TodayDates:
    """Get today's date, with the weekday and the dates of the coming days.

    Call this whenever a task depends on the current date, or mentions a day such as
    "tomorrow", "next Friday" or "in two weeks", instead of guessing: you do not know
    today's date otherwise. All dates are ISO 8601 (YYYY-MM-DD) in the local time zone
    of the machine that runs the tool.

    Returns `today`, its `weekday` (e.g. "Tuesday"), `tomorrow`, `next_weekday` (for
    each weekday from "monday" to "sunday", its next date strictly after today, so
    on a Monday "monday" is a week away), `one_week_from_today` and
    `two_weeks_from_today`.
    """
    return _dates_for(date.today())


def _dates_for(today: date) -> TodayDates:
    """What :func:`get_today_date` returns when today is ``today``."""
    upcoming = (today + timedelta(days=offset) for offset in range(1, 8))
    next_weekday = {_WEEKDAYS[day.weekday()].lower(): day.isoformat() for day in upcoming}
    return TodayDates(
        today=today.isoformat(),
        weekday=_WEEKDAYS[today.weekday()],
        tomorrow=(today + timedelta(days=1)).isoformat(),
        next_weekday=next_weekday,
        one_week_from_today=(today + timedelta(weeks=1)).isoformat(),
        two_weeks_from_today=(today + timedelta(weeks=2)).isoformat(),
    )
