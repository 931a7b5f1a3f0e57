"""bench.chaos's checker: a timeout is excused for a reply a Redis restart forgot only
until the watchdog could have noticed, counted from when Redis was steady again."""

from __future__ import annotations

from typing import Any

from bench.chaos import _REPLY_FORGOTTEN_NOTICED, _check, _Fault, _redis_settled

DEADLINE = 8.0


def test_redis_is_settled_after_the_last_redis_fault_close_behind_a_restart() -> None:
    faults = [
        _Fault(10.0, "redis restart", "without its data"),
        _Fault(11.5, "redis pause", "2958 ms"),  # close behind: ends at 14.458
        _Fault(15.0, "worker SIGKILL", "prefork"),  # no Redis fault: changes nothing
        _Fault(16.0, "redis full", "2 s"),  # within the window after the pause: ends at 18
        _Fault(30.0, "redis pause", "1000 ms"),  # long after: another outage of its own
    ]

    assert _redis_settled(10.0, faults) == 18.0
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
