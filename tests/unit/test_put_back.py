"""executor.seams.put_back: a copy received before its delivery was put back is stale; the
copy taken again from the queue is not."""

from __future__ import annotations

import threading

import pytest

from executor.seams import put_back
from tests.integration.polling import wait_until


@pytest.fixture(autouse=True)
def _empty() -> None:
    put_back._stale.clear()
    put_back._pending.clear()


def test_the_copy_in_memory_is_stale_and_the_copy_taken_again_is_not() -> None:
    first = put_back.receive("tag-1")
    other = put_back.receive("tag-2")

    assert not put_back.is_stale(first)  # nothing was put back yet
    put_back.put_back("tag-1")
    again = put_back.receive("tag-1")  # redelivered: the same tag

    assert put_back.is_stale(first)
    assert not put_back.is_stale(again)
    assert not put_back.is_stale(other)  # a delivery that was not put back


def test_a_delivery_put_back_twice_runs_only_from_its_last_copy() -> None:
    copies = []
    for _ in range(3):
        copies.append(put_back.receive("tag"))
        put_back.put_back("tag")
    last = put_back.receive("tag")

    assert all(put_back.is_stale(copy) for copy in copies)
    assert not put_back.is_stale(last)


@pytest.mark.parametrize("copy", [None, {}, "x", ["tag", "1"], ["tag"], []])
def test_a_request_without_a_copy_number_is_never_stale(copy: object) -> None:
    put_back.receive("tag")
    put_back.put_back("tag")

    assert not put_back.is_stale(copy)


def test_only_the_newest_deliveries_put_back_are_remembered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(put_back, "MAX_REMEMBERED", 3)
    copies = [put_back.receive(f"tag-{i}") for i in range(5)]
    for i in range(5):
        put_back.put_back(f"tag-{i}")

    assert [put_back.is_stale(copy) for copy in copies] == [False, False, True, True, True]


def test_a_copy_begins_or_its_delivery_goes_back_never_both() -> None:
    # The put-back under way (Redis away): the copy in memory may not begin yet.
    waiting = put_back.receive("tag-w")
    number = put_back.reserve("tag-w", unless_begun=True)
    assert number is not None
    assert put_back.begin(waiting, wait=False) is None
    put_back.settle("tag-w", number, done=True)
    assert put_back.begin(waiting) is False  # it went back: the copy taken again runs

    # A copy that began first is left alone by the put-back.
    running = put_back.receive("tag-r")
    assert put_back.begin(running) is True
    assert put_back.reserve("tag-r", unless_begun=True) is None

    # A put-back that gave up lets its copy here run; a waiting begin wakes to it.
    gave_up = put_back.receive("tag-g")
    number = put_back.reserve("tag-g", unless_begun=True)
    assert number is not None
    result: list[bool | None] = []
    waiter = threading.Thread(target=lambda: result.append(put_back.begin(gave_up)))
    waiter.start()
    assert wait_until(lambda: waiter.is_alive(), timeout=1)
    put_back.settle("tag-g", number, done=False)
    waiter.join(5)
    assert result == [True]
