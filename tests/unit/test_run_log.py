"""The run log's events (wire.runlog), and how toolexec ui folds them into calls."""

from __future__ import annotations

import pytest

from executor import runlog as worker_log
from toolexec.ui.app import _environment, _timeline, is_loopback
from toolexec.ui.runs import calls_of, summarise
from wire.models import CallOutcome, CallRequest
from wire.runlog import (
    ABANDONED,
    ANSWERED,
    ENDED,
    FAILED,
    JOINED,
    MAX_LOGGED_CHARS,
    RESENT,
    SENT,
    STARTED,
    TIMEOUT,
    event,
    logged_json,
    progress_value,
    run_of,
    xadd_arguments,
)
from wire.settings import Settings


def sent(call: str, at: int, tool: str = "t") -> dict[str, str]:
    return event(SENT, call, {"tool": tool, "queue": "q"}, at=at)


def ended(call: str, at: int, kind: str = "ok", **fields: object) -> dict[str, str]:
    return event(ENDED, call, {"kind": kind, "worker": "w1", **fields}, at=at)


def test_an_event_is_text_and_leaves_out_what_is_none() -> None:
    entry = event(SENT, "c1", {"tool": "search", "key": None, "deadline": 1500}, at=1000)
    assert entry == {"e": "sent", "call": "c1", "t": "1000", "tool": "search", "deadline": "1500"}
    assert xadd_arguments("k", entry, max_events=100)[:6] == [
        "XADD",
        "k",
        "MAXLEN",
        "~",
        "100",
        "*",
    ]


def test_an_unknown_event_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'begun'"):
        event("begun", "c1")


def test_a_call_without_a_run_is_logged_under_its_client() -> None:
    assert run_of(None, "abc") == "client-abc"
    assert run_of("", "abc") == "client-abc"
    assert run_of("run-1", "abc") == "run-1"


def test_logged_arguments_are_cut_to_their_limit() -> None:
    text = logged_json({"text": "x" * (2 * MAX_LOGGED_CHARS)})
    assert len(text) == MAX_LOGGED_CHARS and text.endswith("…")


@pytest.mark.parametrize(
    ("kind", "error_type", "status"),
    [
        ("ok", None, "ok"),
        ("execution", "ValueError", "error"),
        ("invalid_arguments", "ToolArgumentsInvalid", "error"),
        ("not_found", "ToolNotFound", "error"),
        ("hard_timeout", "HardTimeout", "timeout"),
        ("expired", "DeadlinePassed", "expired"),
        ("expired", "CallerGone", "shed"),
        ("cancelled", "ToolCancelled", "cancelled"),
        ("worker_lost", "WorkerLost", "lost"),
    ],
)
def test_a_workers_end_gives_the_calls_status(
    kind: str, error_type: str | None, status: str
) -> None:
    (call,) = calls_of(
        [sent("c1", 100), ended("c1", 180, kind, type=error_type, started=120, attempts=2)]
    )
    assert call.status == status
    assert (call.sent_at, call.started_at, call.ended_at) == (100, 120, 180)
    assert call.attempts == 2 and call.worker == "w1"
    assert call.error_kind == (None if kind == "ok" else kind)
    assert call.error_type == error_type


def test_a_call_is_queued_then_running_until_it_ends() -> None:
    events = [sent("c1", 100)]
    assert calls_of(events)[0].status == "queued"
    events.append(event(STARTED, "c1", {"worker": "w2", "pool": "asyncio"}, at=130))
    running = calls_of(events, {"c1": progress_value(3, 10, at=140)})[0]
    assert running.status == "running" and running.worker == "w2" and running.pool == "asyncio"
    assert running.progress == {"done": 3, "total": 10, "t": 140}
    events.append(ended("c1", 200, started=130))
    assert calls_of(events)[0].status == "ok"


@pytest.mark.parametrize(
    ("error", "status"),
    [
        ("ToolTimeoutError", "timeout"),
        ("BrokerUnavailable", "unavailable"),
        ("ToolOutcomeUnknown", "unknown"),
    ],
)
def test_the_callers_deadline_wins_and_the_run_it_left_is_kept(error: str, status: str) -> None:
    events = [
        sent("c1", 100),
        event(TIMEOUT, "c1", {"type": error}, at=500),
        ended("c1", 1600, started=110),
    ]
    (call,) = calls_of(events)
    assert call.status == status and call.error_type == error
    assert (call.ended_at, call.ran_until, call.started_at) == (500, 1600, 110)


def test_an_end_the_worker_logged_before_the_callers_timeout_is_kept_as_the_run() -> None:
    # The worker's flush may come first in the log although its caller had given up.
    (call,) = calls_of(
        [sent("c1", 100), ended("c1", 400, started=110), event(TIMEOUT, "c1", {}, at=300)]
    )
    assert call.status == "timeout" and call.ran_until == 400 and call.ended_at == 300


@pytest.mark.parametrize(
    ("error", "status"),
    [("WorkerLost", "lost"), ("ToolCancelled", "cancelled"), ("CallerGone", "shed")],
)
def test_an_error_the_client_made_gives_its_status(error: str, status: str) -> None:
    (call,) = calls_of([sent("c1", 100), event(FAILED, "c1", {"type": error}, at=300)])
    assert (call.status, call.error_type, call.ended_at) == (status, error, 300)


def test_a_caller_that_stopped_waiting_abandoned_its_call() -> None:
    (call,) = calls_of([sent("c1", 100), event(ABANDONED, "c1", at=200)])
    assert call.status == "abandoned"


def test_a_repeat_that_joined_ends_with_the_outcome_it_was_given() -> None:
    events = [
        sent("c1", 100, "book"),
        sent("c2", 105, "book"),
        event(JOINED, "c2", at=105),
        ended("c1", 300, started=110),
        event(ANSWERED, "c2", {"kind": "ok"}, at=301),
        sent("c3", 400, "book"),
        event(JOINED, "c3", {"stored": "1"}, at=400),
        event(ANSWERED, "c3", {"kind": "ok"}, at=401),
    ]
    first, joined, stored = calls_of(events)
    assert not first.joined
    assert joined.joined and not joined.stored and joined.status == "ok"
    assert joined.ended_at == 301 and joined.started_at is None
    assert stored.joined and stored.stored and stored.status == "ok"


def test_calls_come_in_the_order_they_were_sent_and_bad_entries_are_skipped() -> None:
    events = [sent("b", 200), {"e": "sent", "call": "x"}, {"call": "y", "t": "1"}, sent("a", 100)]
    assert [c.call_id for c in calls_of(events)] == ["a", "b"]
    assert calls_of([sent("a", 100)], {"a": "not json"})[0].progress is None


def test_a_runs_summary_counts_its_calls_failures_and_time() -> None:
    calls = calls_of(
        [
            sent("a", 100),
            ended("a", 150, started=110),
            sent("b", 160),
            ended("b", 400, "execution", started=170),
            sent("c", 200),
        ]
    )
    summary = summarise("r", calls, now=1000)
    assert (summary.calls, summary.failures, summary.live) == (3, 1, 1)
    assert summary.time_spent == 900  # a call is live: until now
    done = summarise("r", calls[:2], now=1000)
    assert done.time_spent == 300 and done.last_at == 400


def test_the_timeline_splits_a_bar_into_its_wait_and_its_run() -> None:
    calls = calls_of(
        [sent("a", 0), ended("a", 100, started=40), sent("b", 50), event(TIMEOUT, "b", at=80)]
    )
    rows = _timeline(calls, now=1000)["calls"]
    a, b = rows[0]["bar"], rows[1]["bar"]
    assert a["queue_left"] == 0 and a["queue"] == pytest.approx(72 * 40 / 100)
    assert a["run_left"] == pytest.approx(72 * 40 / 100) and a["run"] == pytest.approx(
        72 * 60 / 100
    )
    assert b["run"] is None and b["queue"] == pytest.approx(72 * 30 / 100)
    assert [m["text"] for m in rows[1]["marks"]] == ["timeout"]


def test_loopback_is_told_from_other_addresses() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.8.9.1", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "10.0.0.2", "::", "example.com"))


def test_a_worker_with_the_run_log_off_keeps_nothing_to_write() -> None:
    settings = Settings.from_env({"TOOLEXEC_RUN_LOG": "off"})
    call = CallRequest(call_id="off-1", tool="t", reply_to="c", run_id="r")
    before = worker_log.pending()
    worker_log.running(call, worker="w", settings=settings)
    worker_log.attempt("off-1", 1)
    worker_log.progress("off-1", 1, 2)
    worker_log.ended(call, CallOutcome.success("off-1", 1), settings=settings)
    assert worker_log.pending() == before


def test_a_keyed_calls_answer_and_its_workers_end_agree_in_either_order() -> None:
    answer = event(ANSWERED, "c1", {"kind": "ok"}, at=310)
    end = ended("c1", 300, "execution", type="ValueError", started=120)
    for events in ([sent("c1", 100), answer, end], [sent("c1", 100), end, answer]):
        (call,) = calls_of(events)
        assert (call.status, call.ended_at, call.started_at) == ("error", 300, 120)
        assert call.error_type == "ValueError" and call.worker == "w1"


def test_a_calls_times_are_kept_in_order_across_the_sides_clocks() -> None:
    # The worker's estimate of Redis' clock reads 2 ms behind its client's.
    (call,) = calls_of([sent("c1", 100), ended("c1", 99, started=98)])
    assert (call.sent_at, call.started_at, call.ended_at) == (100, 100, 100)


def test_a_call_its_watchdog_sent_again_says_how_often() -> None:
    events = [
        sent("c1", 100),
        event(RESENT, "c1", {"generation": 1}, at=3000),
        event(RESENT, "c1", {"generation": 2}, at=6000),
        ended("c1", 6500, started=6100),
    ]
    (call,) = calls_of(events)
    assert call.resent == 2 and call.status == "ok"
    marks = [m["text"] for m in _timeline([call], now=7000)["calls"][0]["marks"]]
    assert "sent again ×2 (worker lost)" in marks


def test_a_logged_run_without_a_call_to_show_says_so() -> None:
    # A log whose entries name no call (an event missing its call, kind or time) folds to
    # no calls: its page says so, as the page of a run not logged says that.
    timeline = _environment().get_template("_timeline.html")
    assert "No calls logged for this run." in timeline.render(run_id="r", **_timeline([], 1000))
    missing = timeline.render(run_id="r", missing="no run 'r' is logged", **_timeline([], 1000))
    assert "no run &#39;r&#39; is logged: this page shows its calls as they are logged" in missing
