"""executor.stats: counts kept in memory per time bucket, queued on a pipeline, read per window."""

from __future__ import annotations

from typing import Any

import pytest

from executor import stats
from wire import keys
from wire.models import CallOutcome, ErrorKind


class RecordingPipe:
    """Collects the commands :func:`stats.flush_into` queues."""

    def __init__(self) -> None:
        self.commands: list[tuple[Any, ...]] = []

    def hincrby(self, key: str, field: str, amount: int) -> None:
        self.commands.append(("hincrby", key, field, amount))

    def expire(self, key: str, seconds: int) -> None:
        self.commands.append(("expire", key, seconds))


@pytest.fixture(autouse=True)
def no_pending() -> None:
    stats.flush_into(RecordingPipe())  # start each test with nothing counted


def failed(kind: ErrorKind) -> CallOutcome:
    return CallOutcome.failure("c", kind, "T", "m")


def test_recording_does_no_io_and_counts_per_bucket_and_kind() -> None:
    at = 1_000_005.0
    stats.record("search", CallOutcome.success("c", 1), redis_url="redis://x", now=at)
    stats.record("search", CallOutcome.success("c", 1), redis_url="redis://x", now=at)
    stats.record("search", failed(ErrorKind.HARD_TIMEOUT), redis_url="redis://x", now=at)

    assert stats.pending() == {
        keys.stats("10:1000000"): {"ok:search": 2, "hard_timeout:search": 1},
        keys.stats("60:999960"): {"ok:search": 2, "hard_timeout:search": 1},
    }


def test_flushing_queues_each_count_once_with_its_buckets_ttl_and_forgets_it() -> None:
    stats.record("book", failed(ErrorKind.EXECUTION), redis_url="redis://x", now=120.0)
    pipe = RecordingPipe()

    queued = stats.flush_into(pipe)

    assert queued == 2
    assert sorted(pipe.commands) == sorted(
        [
            ("hincrby", keys.stats("10:120"), "execution:book", 1),
            ("expire", keys.stats("10:120"), stats.BUCKETS[10]),
            ("hincrby", keys.stats("60:120"), "execution:book", 1),
            ("expire", keys.stats("60:120"), stats.BUCKETS[60]),
        ]
    )
    assert stats.pending() == {}
    assert stats.flush_into(RecordingPipe()) == 0


def test_every_bucket_outlives_the_window_read_from_it() -> None:
    for window, width in stats.WINDOWS.values():
        assert stats.BUCKETS[width] > window + width


def test_every_outcome_kind_is_done_failed_or_timed_out() -> None:
    assert set(stats.CATEGORY) == {"ok", *(kind.value for kind in ErrorKind)}
    assert {kind for kind, category in stats.CATEGORY.items() if category == "timed_out"} == {
        "expired",
        "hard_timeout",
    }


class FakeRedis:
    """HGETALL over a dict of hashes, through a pipeline: what read_counts uses."""

    def __init__(self, hashes: dict[str, dict[bytes, bytes]]) -> None:
        self.hashes = hashes
        self.read: list[str] = []

    def pipeline(self, transaction: bool = False) -> FakeRedis:
        return self

    def hgetall(self, key: str) -> None:
        self.read.append(key)

    def execute(self) -> list[dict[bytes, bytes]]:
        return [self.hashes.get(key, {}) for key in self.read]


def test_reading_sums_the_buckets_that_overlap_each_window() -> None:
    now = 10_000.0
    fake = FakeRedis(
        {
            keys.stats("10:10000"): {b"ok:search": b"2", b"expired:search": b"1"},
            keys.stats("10:9940"): {b"execution:search": b"1"},  # 60 s ago: in the minute
            keys.stats("10:9920"): {b"ok:search": b"50"},  # 80 s ago: not
            keys.stats("60:9960"): {
                b"ok:search": b"52",
                b"execution:search": b"1",
                b"expired:search": b"1",
            },
            keys.stats("60:6360"): {b"ok:other": b"4"},  # 3640 s ago: bucket overlaps the hour
            keys.stats("60:6300"): {b"ok:other": b"100"},  # wholly before it
        }
    )

    counts = stats.read_counts(fake, now)  # type: ignore[arg-type]

    minute, hour = counts["last_minute"]["search"], counts["last_hour"]
    assert (minute.done, minute.failed, minute.timed_out) == (2, 1, 1)
    assert (hour["search"].done, hour["search"].failed, hour["search"].timed_out) == (52, 1, 1)
    assert hour["other"].done == 4
    assert "other" not in counts["last_minute"]
    assert minute.as_dict()["by_kind"] == {"ok": 2, "execution": 1, "expired": 1}
