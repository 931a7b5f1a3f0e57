"""bench.chaos's checker: a timeout is excused for a reply a Redis restart forgot only
until the watchdog could have noticed, counted from when Redis was steady again."""

from __future__ import annotations

from typing import Any

from bench.chaos import (
    _DEAD_CALLER_BOUND,
    _REPLY_FORGOTTEN_NOTICED,
    _check,
    _Fault,
    _redis_settled,
)

DEADLINE = 8.0


def test_redis_is_settled_after_the_last_redis_fault_close_behind_a_restart() -> None:
    faults = [
        _Fault(10.0, "redis restart", "without its data", ended=11.0),  # served again at 11
        _Fault(13.5, "redis pause", "2958 ms"),  # close behind its end: over at 16.458
        _Fault(15.0, "worker SIGKILL", "prefork"),  # no Redis fault: changes nothing
        _Fault(18.0, "redis full", "2 s", ended=20.1),  # within the window after the pause
        _Fault(30.0, "redis pause", "1000 ms"),  # long after: another outage of its own
    ]

    assert _redis_settled(10.0, faults) == 20.1
    assert _redis_settled(30.0, [_Fault(30.0, "redis restart", "without its data")]) == 30.0


def timed_out_after_its_end(faults: list[_Fault]) -> list[str]:
    """The checker's findings for one at-least-once call sent at 0, whose body ended at
    1, and whose caller heard ToolTimeoutError at its deadline."""
    sent: dict[str, dict[str, Any]] = {"1-a": {"tool": "chaos_alo", "at": 0.0}}
    ended = {
        "1-a": {"outcome": "ToolTimeoutError", "at": DEADLINE, "took": DEADLINE, "call_id": "c"}
    }
    effects = {"1-a": [("start", 0.5), ("end", 1.0)]}
    return _check(sent, ended, effects, faults, {}, DEADLINE, 0.0)


def test_a_timeout_after_a_restart_forgot_the_reply_is_excused_only_until_noticed() -> None:
    restart = _Fault(1.5, "redis restart", "without its data")
    # Noticed in time: Redis steady 1.5 s after the end, the deadline 6.5 s later.
    assert timed_out_after_its_end([restart]) == [
        "timeout for a call that had ended: chaos_alo 1-a (c) ended 7.00 s before its deadline"
    ]
    # A pause close behind the restart kept Redis from being steady until 5.5.
    assert DEADLINE - 5.5 < _REPLY_FORGOTTEN_NOTICED
    assert timed_out_after_its_end([restart, _Fault(2.5, "redis pause", "3000 ms")]) == []


def started_after_its_caller_died(start: float, faults: list[_Fault]) -> list[str]:
    """The checker's findings for a call whose caller (pid 7) was SIGKILLed at 0 and whose
    body started at ``start``."""
    sent: dict[str, dict[str, Any]] = {"7-a": {"tool": "chaos_alo", "at": -0.5}}
    effects = {"7-a": [("start", start), ("end", start + 0.1)]}
    return _check(sent, {}, effects, faults, {"7": 0.0}, DEADLINE, -1.0)


def test_a_dead_callers_call_may_start_late_only_where_redis_could_not_be_asked() -> None:
    late = _DEAD_CALLER_BOUND + 3.0
    assert started_after_its_caller_died(_DEAD_CALLER_BOUND - 0.1, []) == []
    assert started_after_its_caller_died(late, []) == [
        f"started after its caller died: 7-a started {late:.2f} s after"
    ]
    # Full memory from 2 s to 4 s: Redis could not be asked, and lets the call run.
    full = _Fault(2.0, "redis full", "2 s", ended=4.0)
    assert started_after_its_caller_died(late, [full]) == []
    # ...but not long after the outage, nor for an outage over before the death.
    assert started_after_its_caller_died(4.0 + _DEAD_CALLER_BOUND + 0.5, [full]) != []
    before = _Fault(-5.0, "redis full", "2 s", ended=-3.0)
    assert started_after_its_caller_died(late, [before]) != []
    # A worker killed is no Redis outage.
    assert started_after_its_caller_died(late, [_Fault(2.0, "worker SIGKILL", "asyncio")]) != []
