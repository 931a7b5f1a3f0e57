"""wire.clock: the offset to Redis' TIME, measured from fake TIME answers, and its users."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Sequence
from datetime import datetime

import pytest
import redis

from executor.context import CallContext
from executor.runner import refuse_if_expired
from wire import clock, keys
from wire.clock import OffsetStore, Sample, SharedClock, best_sample, server_seconds
from wire.message import CELERY_EXPIRY_GRACE, redis_envelope, task_headers
from wire.models import TASK_AT_MOST_ONCE, CallRequest, ErrorKind
from wire.settings import Settings

#: The true time in these tests; the fake host's clock is off from it by its skew.
TRUE = 1_900_000_000.0


class FakeHost:
    """A host whose clocks the test moves, and the Redis TIME it reaches.

    Each ``time()`` takes the next round trip of ``trips`` (seconds, the server read at
    its midpoint): the local clock advances by the round trip, and the server answers
    the true time at the midpoint plus a per-trip error in the answer, if any.
    """

    def __init__(self, skew: float, trips: Sequence[tuple[float, float]] = ((0.002, 0.0),)) -> None:
        self.true = TRUE
        self.skew = skew
        self.monotonic_now = 1000.0
        self.trips = list(trips)
        self.asked = 0
        self.fail: Exception | None = None

    def local(self) -> float:
        return self.true + self.skew

    def monotonic(self) -> float:
        return self.monotonic_now

    def time(self) -> tuple[int, int]:
        if self.fail is not None:
            raise self.fail
        round_trip, error = self.trips[self.asked % len(self.trips)]
        self.asked += 1
        self.true += round_trip / 2
        server = self.true + error
        self.true += round_trip / 2
        seconds = int(server)
        return seconds, round((server - seconds) * 1_000_000)

    def clock(self, *, max_age: float = 60.0, samples: int = 3) -> SharedClock:
        return SharedClock(
            OffsetStore(),
            local=self.local,
            monotonic=self.monotonic,
            max_age=max_age,
            samples=samples,
        )


@pytest.fixture
def worker_ahead() -> Iterator[FakeHost]:
    """This process's shared clock replaced by one on a host 5 s ahead, measured."""
    host = FakeHost(skew=5.0)
    original = clock.shared_clock
    clock.shared_clock = host.clock()
    clock.shared_clock.measure(host)
    yield host
    clock.shared_clock = original


def a_call(deadline: float | None) -> CallRequest:
    return CallRequest(
        call_id="c1", tool="search", arguments={}, reply_to="client", deadline=deadline
    )


# -- the offset math -------------------------------------------------------------------


def test_a_sample_reads_the_server_at_the_midpoint_of_its_round_trip() -> None:
    sample = Sample(sent=100.0, received=100.2, server=95.1)

    assert sample.round_trip == pytest.approx(0.2)
    assert sample.offset == pytest.approx(-5.0)


def test_the_sample_with_the_shortest_round_trip_wins() -> None:
    slow = Sample(sent=0.0, received=0.5, server=10.0)
    fast = Sample(sent=1.0, received=1.01, server=6.005)
    slower = Sample(sent=2.0, received=2.3, server=3.0)

    assert best_sample([slow, fast, slower]) is fast
    with pytest.raises(ValueError, match="no TIME samples"):
        best_sample([])


def test_a_time_answer_is_seconds_and_microseconds() -> None:
    assert server_seconds((1_900_000_000, 250_000)) == 1_900_000_000.25
    assert server_seconds([b"1900000000", b"5"]) == pytest.approx(1_900_000_000.000005)
    for garbage in (None, (1,), ("x", "y"), 12):
        with pytest.raises(ValueError, match="not a TIME answer"):
            server_seconds(garbage)


@pytest.mark.parametrize("skew", [5.0, -5.0, 0.0, 3600.25])
def test_shared_now_is_the_servers_time_whatever_the_local_clock_says(skew: float) -> None:
    host = FakeHost(skew=skew)
    shared = host.clock()

    sample = shared.measure(host)

    assert sample.offset == pytest.approx(-skew, abs=1e-6)
    assert shared.offset == pytest.approx(-skew, abs=1e-6)
    assert shared.now() == pytest.approx(host.true, abs=1e-6)
    host.true += 42.0  # time goes on; no further round trip is needed
    assert shared.now() == pytest.approx(host.true, abs=1e-6)


def test_a_measurement_keeps_the_shortest_round_trip_of_its_samples() -> None:
    # The slow trips' server answers are off by their asymmetry; the fast one is not.
    host = FakeHost(skew=5.0, trips=[(0.400, 0.150), (0.004, 0.0), (0.200, -0.080)])
    shared = host.clock(samples=3)

    sample = shared.measure(host)

    assert host.asked == 3
    assert sample.round_trip == pytest.approx(0.004, abs=1e-6)
    assert shared.offset == pytest.approx(-5.0, abs=1e-6)


def test_an_unmeasured_clock_is_the_local_clock_and_says_so_once_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    host = FakeHost(skew=5.0)
    shared = host.clock()

    with caplog.at_level(logging.DEBUG, logger="wire.clock"):
        readings = [shared.now() for _ in range(3)]

    assert shared.offset is None
    assert readings == [host.local()] * 3
    said = [r for r in caplog.records if "no offset" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.DEBUG


def test_refresh_measures_when_unknown_then_only_once_the_offset_is_old() -> None:
    host = FakeHost(skew=-5.0)
    shared = host.clock(max_age=60.0, samples=3)

    assert shared.refresh_if_stale(host) is True
    assert host.asked == 3
    host.monotonic_now += 59.0
    assert shared.refresh_if_stale(host) is False
    assert host.asked == 3, "a fresh offset was measured again"
    host.monotonic_now += 1.0
    host.skew = -7.0  # an NTP step on the worker
    assert shared.refresh_if_stale(host) is True
    assert host.asked == 6
    assert shared.offset == pytest.approx(7.0, abs=1e-6)


@pytest.mark.parametrize(
    "failure", [redis.ConnectionError("down"), redis.TimeoutError("frozen"), OSError("reset")]
)
def test_a_failed_refresh_keeps_the_old_offset_and_never_raises(failure: Exception) -> None:
    host = FakeHost(skew=5.0)
    shared = host.clock(max_age=60.0)
    shared.measure(host)
    host.monotonic_now += 120.0
    host.skew = 9.0
    host.fail = failure

    assert shared.refresh_if_stale(host) is False
    assert shared.offset == pytest.approx(-5.0, abs=1e-6)
    assert shared.is_stale()


def test_a_redis_that_answers_no_time_changes_nothing() -> None:
    class Garbled(FakeHost):
        def time(self) -> tuple[int, int]:
            return "soon"  # type: ignore[return-value]

    host = Garbled(skew=5.0)
    shared = host.clock()

    assert shared.refresh_if_stale(host) is False
    assert shared.offset is None


def test_a_process_forked_before_the_measurement_reads_it_and_the_parent_reads_its_own() -> None:
    host = FakeHost(skew=5.0)
    shared = host.clock()
    to_child_r, to_child_w = os.pipe()
    to_parent_r, to_parent_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: wait for the parent's measurement, read it, measure anew
        code = 1
        try:
            os.read(to_child_r, 1)
            seen = shared.offset
            host.skew = 2.0
            shared.measure(host)
            os.write(to_parent_w, repr(seen).encode())
            code = 0
        finally:
            os._exit(code)
    shared.measure(host)
    os.write(to_child_w, b"x")
    seen_in_child = os.read(to_parent_r, 64).decode()
    _, status = os.waitpid(pid, 0)
    for fd in (to_child_r, to_child_w, to_parent_r, to_parent_w):
        os.close(fd)

    assert os.waitstatus_to_exitcode(status) == 0
    assert float(seen_in_child) == pytest.approx(-5.0, abs=1e-6)
    assert shared.offset == pytest.approx(-2.0, abs=1e-6), "the child's measurement is shared back"


def test_a_reader_does_not_hang_on_a_write_cut_off_half_way() -> None:
    store = OffsetStore()
    store.write(-5.0, 10.0)
    OffsetStore._SEQ.pack_into(store._map, 0, 3)  # odd: a writer died mid-write

    assert store.read() == (-5.0, 10.0)


# -- the worker's checks and the message, with the worker 5 s ahead ---------------------


def test_a_worker_ahead_does_not_refuse_a_call_with_seconds_left(worker_ahead: FakeHost) -> None:
    call = a_call(worker_ahead.true + 3.0)

    assert worker_ahead.local() > call.deadline  # type: ignore[operator]
    assert refuse_if_expired(call) is None


def test_a_worker_behind_refuses_a_call_whose_deadline_passed() -> None:
    host = FakeHost(skew=-5.0)
    original = clock.shared_clock
    clock.shared_clock = host.clock()
    clock.shared_clock.measure(host)
    try:
        call = a_call(host.true - 1.0)
        assert host.local() < call.deadline  # type: ignore[operator]
        refusal = refuse_if_expired(call)
    finally:
        clock.shared_clock = original

    assert refusal is not None and refusal.error is not None
    assert refusal.error.kind is ErrorKind.EXPIRED


def test_time_left_counts_on_the_shared_clock(worker_ahead: FakeHost) -> None:
    context = CallContext(
        call_id="c1",
        run_id=None,
        tool="search",
        idempotency_key=None,
        deadline=worker_ahead.true + 3.0,
    )

    assert context.time_left() == pytest.approx(3.0, abs=1e-3)


def test_the_ttl_of_a_calls_keys_counts_the_time_left_on_the_shared_clock(
    worker_ahead: FakeHost,
) -> None:
    settings = Settings.from_env({"TOOLEXEC_CLAIM_MARGIN": "1"})
    deadline = worker_ahead.true + 3.0  # passed 2 s ago by this host's clock, 5 s ahead

    ttl = keys.call_ttl_ms("claim", deadline=deadline, hard_timeout=None, settings=settings)

    assert ttl == pytest.approx(4_000, abs=1)


def test_celery_expires_falls_a_grace_after_the_deadline_so_a_clock_ahead_keeps_live_calls(
    worker_ahead: FakeHost,
) -> None:
    call = a_call(worker_ahead.true + 3.0)

    headers = task_headers(call, task_name=TASK_AT_MOST_ONCE)
    expires = datetime.fromisoformat(headers["expires"]).timestamp()

    assert CELERY_EXPIRY_GRACE >= 30.0
    assert expires == pytest.approx(call.deadline + CELERY_EXPIRY_GRACE, abs=1e-6)  # type: ignore[operator]
    assert expires > worker_ahead.local(), "Celery's check on the worker's clock would drop it"


def test_the_messages_ttl_counts_from_the_shared_clock(worker_ahead: FakeHost) -> None:
    call = a_call(worker_ahead.true + 3.0)

    envelope = redis_envelope(
        call, queue="default", headers=task_headers(call, task_name=TASK_AT_MOST_ONCE)
    )

    expiration = int(json.loads(envelope)["properties"]["expiration"])
    assert expiration == pytest.approx((3.0 + CELERY_EXPIRY_GRACE) * 1000, abs=2)
