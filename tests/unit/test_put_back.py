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


def test_the_copy_in_memory_is_stale_and_the_copy_taken_again_is_not(ledger: Ledger) -> None:
    first = ledger.receive("tag-1")
    other = ledger.receive("tag-2")

    assert not ledger.is_stale(first)  # nothing was put back yet
    ledger.put_back("tag-1")
    again = ledger.receive("tag-1")  # redelivered: the same tag

    assert ledger.is_stale(first)
    assert not ledger.is_stale(again)
    assert not ledger.is_stale(other)  # a delivery that was not put back


def test_a_delivery_put_back_twice_runs_only_from_its_last_copy(ledger: Ledger) -> None:
    copies = []
    for _ in range(3):
        copies.append(ledger.receive("tag"))
        ledger.put_back("tag")
    last = ledger.receive("tag")

    assert all(ledger.is_stale(copy) for copy in copies)
    assert not ledger.is_stale(last)


@pytest.mark.parametrize("copy", [None, {}, "x", ["tag", "1"], ["tag"], []])
def test_a_request_without_a_copy_number_is_never_stale(copy: object, ledger: Ledger) -> None:
    ledger.receive("tag")
    ledger.put_back("tag")

    assert not ledger.is_stale(copy)


def test_only_the_newest_deliveries_put_back_are_remembered() -> None:
    ledger = Ledger(max_remembered=3)
    copies = [ledger.receive(f"tag-{i}") for i in range(5)]
    for i in range(5):
        ledger.put_back(f"tag-{i}")

    assert [ledger.is_stale(copy) for copy in copies] == [False, False, True, True, True]


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
