"""The client's record of Redis taking its writes: a death needs a steady stretch of them.

A worker's heartbeat lapses in a Redis pause, restart or full memory; the watchdog and the
catalog take a missing heartbeat for a death only if :class:`Writes` says Redis took this
client's beats all along since the first miss (agent_client/_io/writes.py).
"""

from __future__ import annotations

from agent_client._io.writes import Writes


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _steady(clock: _Clock, writes: Writes, *, seconds: float, step: float = 1 / 3) -> None:
    ends = clock.now + seconds
    while clock.now < ends:
        clock.now += step
        writes.taken()


def test_nothing_is_proven_before_the_first_beat_is_taken() -> None:
    clock = _Clock()
    writes = Writes("toolexec:caller:c", 1.0, clock=clock)
    assert not writes.steady_since(clock.now)
    writes.taken()
    assert not writes.steady_since(clock.now - 0.1)  # the first beat starts the record


def test_beats_taken_on_time_are_evidence_from_the_first_of_them() -> None:
    clock = _Clock()
    writes = Writes("toolexec:caller:c", 1.0, clock=clock)
    writes.taken()
    start = clock.now
    _steady(clock, writes, seconds=2.0)
    assert writes.steady_since(start)
    assert writes.steady_since(clock.now - 1.0)


def test_a_refused_beat_voids_every_moment_before_it() -> None:
    clock = _Clock()
    writes = Writes("toolexec:caller:c", 1.0, clock=clock)
    writes.taken()
    _steady(clock, writes, seconds=1.0)
    before = clock.now
    clock.now += 0.1
    writes.refused()  # out of memory, a restart, a lost answer
    _steady(clock, writes, seconds=1.5)
    assert not writes.steady_since(before)
    assert writes.steady_since(clock.now - 1.0)


def test_a_beat_that_comes_back_late_is_a_stall_not_evidence() -> None:
    # A CLIENT PAUSE: the beat is taken, but only when the pause ends, 2 s later.
    clock = _Clock()
    writes = Writes("toolexec:caller:c", 1.0, clock=clock)
    writes.taken()
    _steady(clock, writes, seconds=1.0)
    before = clock.now
    clock.now += 2.0
    writes.taken()
    assert not writes.steady_since(before)
    _steady(clock, writes, seconds=1.0)
    assert writes.steady_since(clock.now - 0.9)


def test_a_beat_overdue_now_means_redis_may_be_stalled_now() -> None:
    clock = _Clock()
    writes = Writes("toolexec:caller:c", 1.0, clock=clock)
    writes.taken()
    start = clock.now
    _steady(clock, writes, seconds=1.0)
    assert writes.steady_since(start)
    clock.now += 0.95  # the next beat is in flight, unanswered for most of an interval
    assert not writes.steady_since(start)


def test_a_write_that_finds_its_key_forgotten_is_a_restart() -> None:
    # SET ... GET answered nothing though the last write was within the key's life.
    clock = _Clock()
    writes = Writes("toolexec:caller:c", 1.0, clock=clock)
    writes.taken()
    _steady(clock, writes, seconds=1.0)
    before = clock.now
    clock.now += 1 / 3
    writes.taken(kept=False)
    assert not writes.steady_since(before)
    _steady(clock, writes, seconds=1.0)
    assert writes.steady_since(clock.now - 0.9)


def test_a_read_that_misses_the_key_is_no_evidence_even_before_a_write_sees_why() -> None:
    # A restart just now: the next write has not come yet, but a read beside the key
    # found it missing, so that read's view of the workers proves nothing.
    clock = _Clock()
    writes = Writes("toolexec:caller:c", 1.0, clock=clock)
    writes.taken()
    _steady(clock, writes, seconds=1.5)
    before = clock.now - 1.0
    assert writes.steady_since(before)
    clock.now += 0.1
    writes.seen(exists=False)
    assert not writes.steady_since(before)


def test_a_read_that_finds_the_key_changes_nothing_and_a_miss_long_after_the_last_write_is_expected() -> (  # noqa: E501
    None
):
    clock = _Clock()
    writes = Writes("toolexec:caller:c", 1.0, clock=clock)
    writes.taken()
    _steady(clock, writes, seconds=1.5)
    before = clock.now - 1.0
    writes.seen(exists=True)
    assert writes.steady_since(before)
    # Writes stopped (this client's loop, or Redis): a miss then is no new news, and
    # steady_since already says no, as the latest write is not recent.
    clock.now += 1.5
    writes.seen(exists=False)
    assert not writes.steady_since(before)
