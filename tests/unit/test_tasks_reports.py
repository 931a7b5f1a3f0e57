from __future__ import annotations

import time
from datetime import datetime

import pydantic
import pytest

from executor.schema import function_schema
from tasks.reports import slow_report


def test_slow_report_sleeps_for_the_given_seconds_then_reports() -> None:
    started = time.monotonic()

    report = slow_report(0.05)

    assert time.monotonic() - started >= 0.05
    assert report["slept"] == 0.05
    assert report["report"].startswith("Report complete after ")
    assert datetime.fromisoformat(report["finished_at"]).tzinfo is not None


@pytest.mark.parametrize("seconds", [0, -1, 600.5, "soon"])
def test_slow_report_schema_rejects_durations_outside_0_to_600_seconds(seconds: object) -> None:
    model = function_schema(slow_report, name="slow_report").model

    with pytest.raises(pydantic.ValidationError):
        model.model_validate({"seconds": seconds})


def test_slow_report_schema_accepts_whole_and_fractional_seconds() -> None:
    model = function_schema(slow_report, name="slow_report").model

    assert model.model_validate({"seconds": 600}).model_dump() == {"seconds": 600.0}
    assert model.model_validate({"seconds": 0.25}).model_dump() == {"seconds": 0.25}
