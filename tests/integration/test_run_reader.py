"""toolexec ui's reader of run logs reads each entry once, however often a page refreshes.

A run's log holds up to ``TOOLEXEC_RUN_LOG_MAX`` events (10,000 by default), and the
recent-runs page shows fifty runs every 2 s: read whole each time, that is half a million
entries a refresh from the Redis that serves the fleet's calls. These tests write logs
into a Redis of their own, read them with a :class:`RunReader`, and hold it to what it
must show (the calls :func:`calls_of` folds from the whole log) and to what it asks of
Redis: ``XRANGE`` of at most ``chunk`` entries, and only the entries past the last one it
folded (and the log's first entry, which tells whether the log still holds what it
folded).
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
import redis

from tests import redis_stats
from toolexec.ui.runs import RANGES_PER_ROUND, RunReader, calls_of, summarise
from wire import keys
from wire.runlog import ENDED, SENT, event

pytestmark = pytest.mark.integration


def _log(store: redis.Redis, run_id: str, calls: range, *, at: int = 1_000) -> None:
    """Log each call of ``calls`` in ``run_id`` as sent and ended (ok, or an error for
    every seventh)."""
    pipe = store.pipeline(transaction=False)
    for n in calls:
        call_id = f"c{n}"
        kind = "execution" if n % 7 == 0 else "ok"
        fields = {"kind": kind, "worker": "w1", "started": at + n + 1}
        for entry in (
            event(SENT, call_id, {"tool": "t", "queue": "q"}, at=at + n),
            event(ENDED, call_id, fields, at=at + n + 2),
        ):
            pipe.xadd(keys.run_log(run_id), dict[Any, Any](entry))
    pipe.execute()


def _entries(store: redis.Redis, run_id: str) -> list[dict[str, str]]:
    """The whole log of ``run_id``, read at once."""
    raw: Any = store.xrange(keys.run_log(run_id))
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in raw]


def _whole(store: redis.Redis, run_id: str) -> list[dict[str, object]]:
    """The calls of ``run_id`` folded from its whole log."""
    return [c.as_dict() for c in calls_of(_entries(store, run_id))]


def _xranges(store: redis.Redis) -> int:
    return redis_stats.calls_of(store, "xrange")


def _sent_bytes(store: redis.Redis) -> int:
    return int(store.info("stats")["total_net_output_bytes"])


def test_a_refresh_reads_only_what_was_logged_since_the_last(own_store: redis.Redis) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    _log(own_store, run_id, range(1250))  # 2,500 entries
    reader = RunReader(own_store, chunk=1000)

    before, sent = _xranges(own_store), _sent_bytes(own_store)
    first = reader.run(run_id)
    first_bytes = _sent_bytes(own_store) - sent
    # Where the log starts, then 1,000 entries, 1,000 more, and the last 500.
    assert _xranges(own_store) - before == 4
    assert first is not None
    assert [c.as_dict() for c in first] == _whole(own_store, run_id)

    before, sent = _xranges(own_store), _sent_bytes(own_store)
    again = reader.run(run_id)
    assert again is not None and [c.as_dict() for c in again] == [c.as_dict() for c in first]
    assert _xranges(own_store) - before == 2  # where the log starts, and what follows
    # Two entries (the first, and the last folded, from which the range starts) and the
    # INFO replies, not the log again.
    assert _sent_bytes(own_store) - sent < first_bytes / 20

    _log(own_store, run_id, range(1250, 1260))
    before = _xranges(own_store)
    grown = reader.run(run_id)
    assert _xranges(own_store) - before == 2
    assert grown is not None and len(grown) == 1260
    assert [c.as_dict() for c in grown] == _whole(own_store, run_id)


def test_the_recent_runs_are_summed_up_from_what_each_log_holds(own_store: redis.Redis) -> None:
    runs = {f"run-{uuid.uuid4().hex[:8]}": size for size in (3, 1200, 40)}
    for at, (run_id, size) in enumerate(runs.items()):
        _log(own_store, run_id, range(size))
        own_store.zadd(keys.RUNS, {run_id: at})
    reader = RunReader(own_store, chunk=500)

    for refresh in range(3):  # read, then refreshed with nothing new, then with more
        if refresh == 2:
            _log(own_store, next(iter(runs)), range(3, 13))
            runs[next(iter(runs))] = 13
        before, sent = _xranges(own_store), _sent_bytes(own_store)
        summaries = reader.runs(now=10_000)
        if refresh == 1:  # where each log starts, and what follows its last entry read
            assert _xranges(own_store) - before == 2 * len(runs)
            assert _sent_bytes(own_store) - sent < 10_000
        assert [s.run_id for s in summaries] == list(reversed(runs))  # newest first
        for summary in summaries:
            calls = calls_of(_entries(own_store, summary.run_id))
            assert summary == summarise(summary.run_id, calls, 10_000)
            assert summary.calls == runs[summary.run_id]
            assert summary.failures == len(range(0, runs[summary.run_id], 7))


def test_more_runs_than_a_round_trip_asks_for_are_each_summed_up(own_store: redis.Redis) -> None:
    runs = [f"run-{n:02d}-{uuid.uuid4().hex[:6]}" for n in range(2 * RANGES_PER_ROUND + 5)]
    for at, run_id in enumerate(runs):
        _log(own_store, run_id, range(at + 1))
        own_store.zadd(keys.RUNS, {run_id: at})
    reader = RunReader(own_store, chunk=4)

    summaries = reader.runs(now=10_000, limit=len(runs))

    assert [(s.run_id, s.calls) for s in summaries] == [
        (run_id, at + 1) for at, run_id in reversed(list(enumerate(runs)))
    ]


def test_past_its_calls_bound_the_reader_lets_go_of_the_runs_read_least_recently(
    own_store: redis.Redis,
) -> None:
    first, second = (f"run-{uuid.uuid4().hex[:8]}" for _ in range(2))
    _log(own_store, first, range(30))
    _log(own_store, second, range(30))
    reader = RunReader(own_store, chunk=8, keep_calls=50)
    whole = 1 + 9  # its head, then 8 entries and 7 more a range until its 60 are read

    assert reader.run(first) is not None
    assert reader.run(second) is not None  # 60 calls: the first run is let go
    before = _xranges(own_store)
    again = reader.run(first)  # read whole again
    assert _xranges(own_store) - before == whole
    assert again is not None and [c.as_dict() for c in again] == _whole(own_store, first)
    before = _xranges(own_store)
    assert reader.run(first) is not None  # kept: its head, and from its last entry
    assert _xranges(own_store) - before == 2
    before = _xranges(own_store)
    assert reader.run(second) is not None  # let go in turn: read whole
    assert _xranges(own_store) - before == whole


@pytest.mark.parametrize("change", ["trimmed", "made again"])
def test_a_log_trimmed_past_what_was_read_or_made_again_is_shown_as_it_now_is(
    own_store: redis.Redis, change: str
) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    _log(own_store, run_id, range(20))
    reader = RunReader(own_store, chunk=8)
    shown = reader.run(run_id)
    assert shown is not None and len(shown) == 20

    if change == "trimmed":  # MAXLEN: the oldest go, some calls with both their events
        _log(own_store, run_id, range(20, 30))
        own_store.xtrim(keys.run_log(run_id), maxlen=25, approximate=False)
    else:  # its TTL passed unseen, and the run logged again
        own_store.delete(keys.run_log(run_id))
        _log(own_store, run_id, range(100, 103))

    shown = reader.run(run_id)
    assert shown is not None
    assert [c.as_dict() for c in shown] == _whole(own_store, run_id)
    assert len(shown) == (13 if change == "trimmed" else 3)


def test_a_lapsed_log_is_not_shown_and_a_run_not_logged_is_none(own_store: redis.Redis) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    _log(own_store, run_id, range(5))
    own_store.zadd(keys.RUNS, {run_id: 1})
    reader = RunReader(own_store)
    assert reader.run(run_id) is not None
    assert [s.run_id for s in reader.runs(now=10_000)] == [run_id]

    own_store.delete(keys.run_log(run_id))  # its TTL passed

    assert reader.run(run_id) is None
    assert reader.runs(now=10_000) == []
    assert reader.run("no-such-run") is None


def test_runs_let_go_of_are_read_whole_again(own_store: redis.Redis) -> None:
    run_ids = [f"run-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    for run_id in run_ids:
        _log(own_store, run_id, range(30))
    reader = RunReader(own_store, chunk=8, keep=2)

    for round_ in range(3):
        for run_id in run_ids:  # each read lets go of the run read two reads before
            _log(own_store, run_id, range(30 + round_, 31 + round_))
            shown = reader.run(run_id)
            assert shown is not None
            assert [c.as_dict() for c in shown] == _whole(own_store, run_id)


def test_readers_in_several_threads_while_the_log_grows_show_every_call_once(
    own_store: redis.Redis,
) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    _log(own_store, run_id, range(100))
    reader = RunReader(own_store, chunk=16)
    wrong: list[str] = []
    done = threading.Event()

    def read() -> None:
        shown_before = 0
        while not done.is_set():
            try:
                ids = [c.call_id for c in reader.run(run_id) or []]
            except Exception as exc:  # noqa: BLE001 - told to the test, not lost in a thread
                wrong.append(repr(exc))
                return
            if len(ids) != len(set(ids)) or len(ids) < shown_before:
                wrong.append(f"{len(ids)} calls ({len(set(ids))} distinct) after {shown_before}")
            shown_before = len(ids)

    threads = [threading.Thread(target=read) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        for start in range(100, 600, 25):
            _log(own_store, run_id, range(start, start + 25))
    finally:
        done.set()
        for thread in threads:
            thread.join(timeout=30)

    assert not wrong, wrong[:5]
    shown = reader.run(run_id)
    assert shown is not None and [c.as_dict() for c in shown] == _whole(own_store, run_id)


def test_a_chunk_too_small_to_move_on_is_refused() -> None:
    with pytest.raises(ValueError, match="chunk must be at least 2"):
        RunReader(redis.Redis(), chunk=1)
