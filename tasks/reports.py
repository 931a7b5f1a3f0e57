"""The ``slow_report`` tool: a stand-in for work that takes a known, long time.

It sleeps for as long as it is asked, which makes it the tool to try deadlines, hard
limits and worker pools with: the caller chooses exactly how long the work lasts.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated, TypedDict

from pydantic import Field

from executor import tool

__all__ = ["Report", "slow_report"]

#: The longest report the tool agrees to prepare, in seconds.
MAX_SECONDS = 600.0


class Report(TypedDict):
    """What ``slow_report`` returns."""

    slept: float
    report: str
    finished_at: str


@tool
def slow_report(seconds: Annotated[float, Field(gt=0, le=MAX_SECONDS)]) -> Report:
    """Prepare a report that takes exactly `seconds` seconds of work, then return it.

    Use it when the user asks for a slow or long-running report, or to see how long
    work behaves. The result says how long the work took (`slept`), carries the
    `report` text and says when it finished (`finished_at`, UTC, ISO 8601).

    Args:
        seconds: How long the work lasts, in seconds: more than 0 and at most 600.
    """
    started = time.monotonic()
    time.sleep(seconds)
    slept = time.monotonic() - started
    return Report(
        slept=seconds,
        report=f"Report complete after {slept:.2f} s of work.",
        finished_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
    )
