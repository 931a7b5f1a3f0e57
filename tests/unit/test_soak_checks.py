"""bench.soak_checks: the soak's verdict fails on every error its faults do not explain."""

from __future__ import annotations

from collections import Counter

from bench.soak_checks import RSS_GROWTH_LIMIT_KIB, KeyCheck, check_errors, check_rss, error_bounds

BOUNDS = error_bounds(kills=2, concurrency=2, redis_restarts=1, workers=2, at_most_once=["search"])


def test_errors_within_what_the_faults_explain_pass() -> None:
    ended = Counter(
        {("search", "result"): 190, ("search", "WorkerLost"): 8, ("book", "ToolOutcomeUnknown"): 4}
    )
    assert check_errors(ended, BOUNDS) == []


def test_more_errors_than_the_faults_explain_fail() -> None:
    ended = Counter({("search", "WorkerLost"): 9, ("search", "ToolOutcomeUnknown"): 5})
    assert check_errors(ended, BOUNDS) == [
        "5 calls ended ToolOutcomeUnknown; the faults explain at most 4",
        "9 calls ended WorkerLost; the faults explain at most 8",
    ]


def test_an_error_no_fault_explains_fails_even_once() -> None:
    for kind in ("BrokerUnavailable", "ToolTimeoutError", "ToolExecutionError", "ToolNotFound"):
        assert check_errors(Counter({("search", kind): 1}), BOUNDS) == [
            f"1 calls ended {kind}; the faults explain at most 0"
        ]


def test_worker_lost_for_an_at_least_once_tool_fails() -> None:
    assert check_errors(Counter({("book", "WorkerLost"): 1}), BOUNDS) == [
        "1 book calls (at least once) ended WorkerLost"
    ]


def test_rss_is_compared_on_the_processes_sampled_throughout() -> None:
    growth, problems = check_rss(
        [{1: 100, 2: 100, 3: 50}, {1: 100, 2: 100 + RSS_GROWTH_LIMIT_KIB + 1}]
    )
    assert growth == {1: 0, 2: RSS_GROWTH_LIMIT_KIB + 1}  # 3 exited: not compared
    assert problems == [
        f"process 2 grew by {RSS_GROWTH_LIMIT_KIB + 1} KiB (limit {RSS_GROWTH_LIMIT_KIB})"
    ]
    assert check_rss([{1: 100}])[1] == ["fewer than two RSS samples after the last restart"]


def test_keys_fail_when_a_calls_key_outlives_the_wait_or_the_count_is_not_the_baselines() -> None:
    found = KeyCheck(
        baseline=8,
        after=15,
        families={"worker": (2, 1, 1.0)},
        baseline_kinds=8,
        long_rule=6,
        call_keys_left=1,
    )
    assert found.problems(waited=True, live_workers=2) == [
        "1 keys of calls outlived their TTLs",
        "DBSIZE 15 is not the baseline 8 plus 6 long-rule keys",
    ]
    assert found.problems(waited=False, live_workers=2) == []
    assert found.problems(waited=False, live_workers=3) == ["2 heartbeats for 3 live workers"]
