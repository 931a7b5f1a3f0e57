"""The shortened soak (CI's): ``python -m bench soak --smoke`` passes, and says why.

It runs as a subprocess, as an operator would: its own private Redis with AOF and two
real prefork workers, one SIGKILLed and restarted twice, Redis restarted once, one
poison message, TTLs of seconds. The soak fails itself (exit status 1) on any check
(``bench/soak_checks.py``); this test also reads its report, so that a check that
stopped being made, or a fault that stopped being injected, fails here too.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.soak]

ROOT = Path(__file__).resolve().parents[2]


def _row(report: str, label: str) -> int:
    """The number in the first cell after ``label`` in a report's table row."""
    match = re.search(rf"^\| {re.escape(label)} +\| (\d+) +\|", report, re.MULTILINE)
    assert match is not None, f"no row {label!r} in the report:\n{report}"
    return int(match.group(1))


def _kept(workdir: Path) -> str:
    """The end of each log the soak kept in ``workdir``: what a failure's message shows."""
    logs = sorted(workdir.rglob("*.log"))
    return "\n".join(f"--- {log.name}, last lines:\n{log.read_text()[-3000:]}" for log in logs)


def test_a_short_soak_ends_every_call_as_its_faults_allow_books_once_and_leaves_redis_and_workers_as_found(  # noqa: E501
    tmp_path: Path,
) -> None:
    # Kept (worker logs at INFO, Redis' AOF, the booking ledger): a failure shows them.
    workdir = tmp_path / "soak"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "soak", "--smoke", "--keep", str(workdir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    report = done.stdout
    assert done.returncode == 0, (
        f"exit {done.returncode}\n{report}\n{done.stderr[-4000:]}\n{_kept(workdir)}"
    )
    assert report.rstrip().endswith("Result: PASS"), report
    # The faults were injected.
    assert "SIGKILLed soak1" in report and "SIGKILLed soak2" in report
    assert "restarted Redis" in report and "LPUSHed b'garbage'" in report
    # Every call ended, in a result or an error its fault explains (no other kind).
    assert _row(report, "total ended") == 600 and _row(report, "never ended") == 0
    ended = report.partition("## How the calls ended")[2].partition("## Bookings")[0]
    errors = re.findall(r"^\| (\w+) +\| (\d+) +\| (\d+) +\|", ended, re.MULTILINE)
    errors = [
        (kind, calls, allowed) for kind, calls, allowed in errors if kind not in ("never", "total")
    ]
    assert {kind for kind, _, _ in errors} <= {"WorkerLost", "ToolOutcomeUnknown"}, errors
    assert all(int(calls) <= int(allowed) for _, calls, allowed in errors), errors
    # One booking per successful booking call.
    successful = _row(report, "successful soak_book_flight calls")
    assert successful > 0
    assert _row(report, "duplicate bookings") == 0
    assert _row(report, "bodies run again with no kill to explain it") == 0
    assert _row(report, "bookings in the ledger") == successful + _row(
        report, "bookings of calls that ended in an error"
    )
    # Redis: every call's keys expired; what is left is the baseline's kinds and keys
    # whose rules outlive the wait, each within its rule.
    assert "after waiting" in report
    assert _row(report, "of calls, left") == 0
    assert _row(report, "with a TTL longer than its rule") == 0
    assert _row(report, "without a TTL beyond the catalog and kombu's") == 0
    assert _row(report, "of no known kind") == 0
    assert _row(
        report,
        "of the baseline's kinds (catalog, workers, heartbeats, the client's liveness, kombu)",
    ) == _row(report, "DBSIZE before the calls")
    # Worker RSS was compared on the same processes after the last restart.
    assert re.search(r"After the last restart, [1-9]\d* processes sampled throughout", report), (
        report
    )
