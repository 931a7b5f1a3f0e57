"""executor.seams.put_back.Ledger: a copy received before its delivery was put back is
stale; the copy taken again from the queue is not."""

from __future__ import annotations

import threading

import pytest

from executor.seams.put_back import Ledger
from tests.integration.polling import wait_until


@pytest.fixture
def ledger() -> Ledger:
    """A ledger of its own (the process's, ``LEDGER``, is the worker's)."""
    return Ledger()


def put_back(ledger: Ledger, tag: str) -> None:
    """What a put-back that succeeded tells the ledger (``PutBacks._put_back_once``)."""
    number = ledger.reserve(tag, unless_begun=False)
    assert number is not None
    ledger.settle(tag, number, done=True)


def test_the_copy_in_memory_is_stale_and_the_copy_taken_again_is_not(ledger: Ledger) -> None:
    first = ledger.receive("tag-1")
    other = ledger.receive("tag-2")
    put_back(ledger, "tag-1")
    again = ledger.receive("tag-1")  # redelivered: the same tag

    assert ledger.begin(first) is False
    assert ledger.begin(again) is True
    assert ledger.begin(other) is True  # a delivery that was not put back


def test_a_copy_runs_when_nothing_was_put_back(ledger: Ledger) -> None:
    copy = ledger.receive("tag")

    assert ledger.begin(copy) is True
    assert ledger.reserve("tag", unless_begun=True) is None  # begun: a put-back leaves it


def test_a_delivery_put_back_twice_runs_only_from_its_last_copy(ledger: Ledger) -> None:
    copies = []
    for _ in range(3):
        copies.append(ledger.receive("tag"))
        put_back(ledger, "tag")
    last = ledger.receive("tag")

    assert [ledger.begin(copy) for copy in copies] == [False, False, False]
    assert ledger.begin(last) is True


@pytest.mark.parametrize("copy", [None, {}, "x", ["tag", "1"], ["tag"], []])
def test_a_request_without_a_copy_number_is_never_stale(copy: object, ledger: Ledger) -> None:
    ledger.receive("tag")
    put_back(ledger, "tag")

    assert ledger.begin(copy) is True


def test_only_the_newest_deliveries_put_back_are_remembered() -> None:
    ledger = Ledger(max_remembered=3)
    copies = [ledger.receive(f"tag-{i}") for i in range(5)]
    for i in range(5):
        put_back(ledger, f"tag-{i}")

    assert [ledger.begin(copy) for copy in copies] == [True, True, False, False, False]


def test_a_copy_begins_or_its_delivery_goes_back_never_both(ledger: Ledger) -> None:
    # The put-back under way (Redis away): the copy in memory may not begin yet.
    waiting = ledger.receive("tag-w")
    number = ledger.reserve("tag-w", unless_begun=True)
    assert number is not None
    assert ledger.begin(waiting, wait=False) is None
    ledger.settle("tag-w", number, done=True)
    assert ledger.begin(waiting) is False  # it went back: the copy taken again runs

    # A copy that began first is left alone by the put-back.
    running = ledger.receive("tag-r")
    assert ledger.begin(running) is True
    assert ledger.reserve("tag-r", unless_begun=True) is None

    # A put-back that gave up lets its copy here run; a waiting begin wakes to it.
    gave_up = ledger.receive("tag-g")
    number = ledger.reserve("tag-g", unless_begun=True)
    assert number is not None
    result: list[bool | None] = []
    waiter = threading.Thread(target=lambda: result.append(ledger.begin(gave_up)))
    waiter.start()
    assert wait_until(lambda: waiter.is_alive(), timeout=1)
    ledger.settle("tag-g", number, done=False)
    waiter.join(5)
    assert result == [True]
