"""The asyncio pool's inbox: polled while calls arrive together, not at one call at a time.

While several calls are on the loop, the loop looks for new requests every
``INBOX_POLL`` seconds instead of being woken for each; with one call at a time there is
nothing to gather, so a request handed over after the last call ended wakes the loop at
once instead of waiting for the next look (which made a sequential round trip last at
least ``INBOX_POLL``). The pool runs here without a worker: a task that is not async goes
through Celery's own trace function (``apply_target``) in a thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from celery import Celery

from executor.pools import asyncio_pool
from executor.pools.asyncio_pool import AsyncioPool

#: A look far longer than any wake-up: a request that waited for it shows.
_LONG_POLL = 1.0


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[AsyncioPool]:
    monkeypatch.setattr(asyncio_pool, "INBOX_POLL", _LONG_POLL)
    app = Celery("inbox-test", set_as_current=False)
    started = AsyncioPool(limit=10, app=app)
    started.on_start()
    try:
        yield started
    finally:
        started.on_stop()


def _apply(pool: AsyncioPool, target: object) -> threading.Event:
    done = threading.Event()
    pool.on_apply(target, args=("not-an-async-task",), callback=lambda _: done.set())
    return done


def test_calls_one_at_a_time_wait_for_no_look_of_the_inbox(pool: AsyncioPool) -> None:
    for _ in range(3):  # before, the second call waited for the look INBOX_POLL later
        started = time.monotonic()
        assert _apply(pool, lambda *_: None).wait(_LONG_POLL)
        assert time.monotonic() - started < _LONG_POLL / 4


def test_requests_arriving_while_a_call_runs_wait_for_the_look(pool: AsyncioPool) -> None:
    release = threading.Event()
    blocked = _apply(pool, lambda *_: release.wait(10))
    first = _apply(pool, lambda *_: None)  # both on the loop: polling
    assert first.wait(_LONG_POLL)
    started = time.monotonic()
    later = _apply(pool, lambda *_: None)
    assert later.wait(_LONG_POLL * 2)
    assert time.monotonic() - started > _LONG_POLL / 4  # gathered by the next look
    release.set()
    assert blocked.wait(5)


def test_the_last_call_ending_stops_the_polling(pool: AsyncioPool) -> None:
    release = threading.Event()
    blocked = _apply(pool, lambda *_: release.wait(10))
    assert _apply(pool, lambda *_: None).wait(_LONG_POLL)  # polling now
    release.set()
    assert blocked.wait(5)
    time.sleep(0.05)  # the loop forgets the call
    started = time.monotonic()
    assert _apply(pool, lambda *_: None).wait(_LONG_POLL)
    assert time.monotonic() - started < _LONG_POLL / 4
