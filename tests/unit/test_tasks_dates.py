from __future__ import annotations

from datetime import date, timedelta

import pytest

from tasks.dates import _dates_for, get_today_date

_WEEKDAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]


def test_dates_for_a_wednesday_name_the_day_and_the_days_after_it() -> None:
    assert _dates_for(date(2024, 5, 15)) == {
        "today": "2024-05-15",
        "weekday": "Wednesday",
        "tomorrow": "2024-05-16",
        "next_weekday": {
            "thursday": "2024-05-16",
            "friday": "2024-05-17",
            "saturday": "2024-05-18",
            "sunday": "2024-05-19",
            "monday": "2024-05-20",
            "tuesday": "2024-05-21",
            "wednesday": "2024-05-22",
        },
        "one_week_from_today": "2024-05-22",
        "two_weeks_from_today": "2024-05-29",
    }


def test_next_weekday_of_todays_weekday_is_a_week_away() -> None:
    monday = date(2024, 7, 1)

    dates = _dates_for(monday)

    assert dates["weekday"] == "Monday"
    assert dates["next_weekday"]["monday"] == "2024-07-08" == dates["one_week_from_today"]


def test_dates_roll_over_the_end_of_a_month() -> None:
    dates = _dates_for(date(2024, 4, 30))

    assert dates["tomorrow"] == "2024-05-01"
    assert dates["two_weeks_from_today"] == "2024-05-14"


def test_dates_roll_over_the_end_of_a_year() -> None:
    dates = _dates_for(date(2024, 12, 29))

    assert dates["weekday"] == "Sunday"
    assert dates["tomorrow"] == "2024-12-30"
    assert dates["next_weekday"]["friday"] == "2025-01-03"
    assert dates["next_weekday"]["sunday"] == "2025-01-05" == dates["one_week_from_today"]
    assert dates["two_weeks_from_today"] == "2025-01-12"


@pytest.mark.parametrize("leap_day", [date(2024, 2, 28), date(2023, 2, 28)])
def test_dates_know_leap_years(leap_day: date) -> None:
    expected = "2024-02-29" if leap_day.year == 2024 else "2023-03-01"

    assert _dates_for(leap_day)["tomorrow"] == expected


@pytest.mark.parametrize("offset", range(7))
def test_next_weekday_holds_each_of_the_next_seven_days_once(offset: int) -> None:
    today = date(2025, 3, 3) + timedelta(days=offset)

    upcoming = _dates_for(today)["next_weekday"]

    assert sorted(upcoming) == sorted(_WEEKDAYS)
    expected = {(today + timedelta(days=n)).isoformat() for n in range(1, 8)}
    assert set(upcoming.values()) == expected
    for name, iso in upcoming.items():
        assert _WEEKDAYS[date.fromisoformat(iso).weekday()] == name


def test_get_today_date_reports_the_local_date() -> None:
    before = date.today()

    dates = get_today_date()

    assert dates["today"] in {before.isoformat(), date.today().isoformat()}
    assert dates == _dates_for(date.fromisoformat(dates["today"]))
