"""An idempotency key's state through whole calls: the client's claim script, then the
worker's begin and complete (:mod:`executor.claims`), on a Redis of their own.

Each path of the one state key (``run:``, ``wait:``, ``done:``, :mod:`wire.formats`)
is walked here: the first delivery and what it costs in commands, a redelivery after
the outcome was stored, callers that join before and during the run, a dead holder
taken over, an outcome that is not stored, a repeat whose claim expired while its
outcome is still stored, and a dead child's state let go. The counts are the server's
own (``INFO commandstats``): commands a script runs count, and so does the script call.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from executor.claims import begin, complete, release
from tests.redis_stats import commands
from toolexec import RedisServer
from wire import keys
from wire.formats import KeyState, reply_frame, running_state
from wire.models import CallRequest
from wire.scripts import BEGIN, CLAIM, COMPLETE, DELIVER, RELEASE_HOLDER

from .keyed import HOLDER, OTHER, TTL_MS, Idempotent, claim, sent, state_of
from .support import unique

OK = '{"ok": true}'


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    """A server of its own: nothing else sends it a command while a test counts."""
    server = RedisServer(directory=tmp_path_factory.mktemp("counted-redis"))
    with server, redis.Redis.from_url(server.url) as connection:
        for script in (CLAIM, BEGIN, COMPLETE, DELIVER, RELEASE_HOLDER):
            script.load(connection)
        yield connection


@pytest.fixture
def idem() -> Idempotent:
    return Idempotent()


def call_of(idem: Idempotent, call_id: str) -> CallRequest:
    return CallRequest(
        call_id=call_id, tool="book", reply_to=unique("client"), idempotency_key=idem.key
    )


def claim_call(client: redis.Redis, idem: Idempotent, call: CallRequest) -> tuple[str, str]:
    """The client's claim of ``call`` (its own reply address in its waiter entry)."""
    return claim(client, idem, call.call_id, reply_to=call.reply_to)


def begin_call(client: redis.Redis, call: CallRequest, tag: str = HOLDER) -> tuple[str, str]:
    return begin(client, call, holder=tag, hostname="w1@host", ttl_ms=TTL_MS)


def complete_call(
    client: redis.Redis,
    call: CallRequest,
    encoded: str = OK,
    *,
    store: bool = True,
    tag: str = HOLDER,
) -> None:
    complete(client, call, encoded, store=store, holder=tag, outcome_ttl=120, reply_ttl=30)


def frames(client: redis.Redis, call: CallRequest) -> list[bytes | str]:
    return list(client.lrange(keys.reply(call.reply_to), 0, -1))


# -- the first delivery --------------------------------------------------------------


def test_a_claim_that_dispatches_costs_the_client_three_commands(
    counted: redis.Redis, idem: Idempotent
) -> None:
    before = commands(counted)

    assert claim(counted, idem, "call-1") == ("claimed", "")

    # SET the claim NX, LPUSH the message: the state is not read on this path.
    assert sent(counted, before) == {"evalsha": 1, "set": 1, "lpush": 1}


def test_the_first_delivery_of_an_idempotent_call_costs_the_worker_four_commands(
    counted: redis.Redis, idem: Idempotent
) -> None:
    call = call_of(idem, "call-1")
    before = commands(counted)
    state = begin_call(counted, call)
    begun = sent(counted, before)
    running = state_of(counted, idem)
    before = commands(counted)
    complete_call(counted, call)
    completed = sent(counted, before)

    assert state == ("run", "")
    assert running == KeyState(holder=HOLDER)
    # begin: SET the state NX; complete: SET the stored outcome (GET what it replaces),
    # RPUSH the claimant's frame, EXPIRE its reply list. No script, no GET, no DEL.
    assert begun == {"set": 1}
    assert completed == {"set": 1, "rpush": 1, "expire": 1}
    assert state_of(counted, idem) == KeyState(outcome=OK)
    assert 110_000 < counted.pttl(idem.state) <= 120_000  # the outcome TTL
    assert frames(counted, call) == [reply_frame(call.call_id, OK).encode()]


def test_a_delivery_after_the_outcome_was_stored_is_answered_from_it_and_runs_nothing(
    counted: redis.Redis, idem: Idempotent
) -> None:
    call = call_of(idem, "call-1")
    begin_call(counted, call)
    complete_call(counted, call)
    before = commands(counted)

    # A redelivery, on this worker or another: the SET NX fails, the script reads the store.
    assert begin_call(counted, call, OTHER) == ("stored", OK)

    assert sent(counted, before) == {"set": 1, "evalsha": 1, "get": 1}
    assert state_of(counted, idem) == KeyState(outcome=OK)


# -- callers that join ---------------------------------------------------------------


def test_a_caller_that_joins_before_the_run_begins_is_told_through_the_flag(
    counted: redis.Redis, idem: Idempotent
) -> None:
    claimant, joiner = call_of(idem, "call-1"), call_of(idem, "call-2")
    claim_call(counted, idem, claimant)
    assert claim_call(counted, idem, joiner) == ("joined", "")
    assert state_of(counted, idem) == KeyState(waiters=True)  # nobody began it yet

    assert begin_call(counted, claimant) == ("run", "")  # the begin script takes it
    assert state_of(counted, idem) == KeyState(holder=HOLDER, waiters=True)
    complete_call(counted, claimant)

    for caller in (claimant, joiner):
        assert frames(counted, caller) == [reply_frame(caller.call_id, OK).encode()]
    assert state_of(counted, idem) == KeyState(outcome=OK)
    assert not counted.exists(idem.waiters)


def test_a_caller_that_joins_during_the_run_is_told_in_one_more_script(
    counted: redis.Redis, idem: Idempotent
) -> None:
    claimant, joiner = call_of(idem, "call-1"), call_of(idem, "call-2")
    claim_call(counted, idem, claimant)
    begin_call(counted, claimant)
    assert claim_call(counted, idem, joiner) == ("joined", "")
    assert state_of(counted, idem) == KeyState(holder=HOLDER, waiters=True)
    before = commands(counted)

    complete_call(counted, claimant)

    counts = sent(counted, before)
    assert counts.pop("evalsha") == 1  # deliver, after the flag came back
    assert counts == {"set": 1, "rpush": 2, "expire": 2, "lrange": 1, "del": 1}
    for caller in (claimant, joiner):
        assert frames(counted, caller) == [reply_frame(caller.call_id, OK).encode()]
    assert not counted.exists(idem.waiters)


def test_a_second_delivery_during_the_run_joins_it_and_hears_its_outcome(
    counted: redis.Redis, idem: Idempotent
) -> None:
    first, second = call_of(idem, "call-1"), call_of(idem, "call-1")
    counted.set(keys.worker("w2@host:200"), "{}", px=TTL_MS)  # the other worker beats
    begin_call(counted, first, OTHER)

    assert begin_call(counted, second) == ("busy", OTHER)
    complete_call(counted, first, tag=OTHER)

    assert frames(counted, second) == [reply_frame(second.call_id, OK).encode()]


# -- dead holders ----------------------------------------------------------------------


def test_a_dead_holders_state_is_taken_over_and_its_joiners_are_told(
    counted: redis.Redis, idem: Idempotent
) -> None:
    # The holder's worker has no heartbeat: it is dead (patience 0: no wait for one).
    dead, joiner, redelivery = (
        call_of(idem, "call-1"),
        call_of(idem, "call-2"),
        call_of(idem, "call-3"),
    )
    counted.set(idem.state, running_state(f"{unique('gone')}@host:300|301"), px=TTL_MS)
    claim_call(counted, idem, dead)
    assert claim_call(counted, idem, joiner) == ("joined", "")

    assert begin_call(counted, redelivery) == ("run", "")
    assert state_of(counted, idem) == KeyState(holder=HOLDER, waiters=True)
    complete_call(counted, redelivery)

    assert frames(counted, joiner) == [reply_frame(joiner.call_id, OK).encode()]
    assert state_of(counted, idem) == KeyState(outcome=OK)


def test_a_dead_childs_state_is_let_go_and_its_joiners_wait_for_the_next_delivery(
    counted: redis.Redis, idem: Idempotent
) -> None:
    call, joiner = call_of(idem, "call-1"), call_of(idem, "call-2")
    claim_call(counted, idem, call)
    begin_call(counted, call, OTHER)
    claim_call(counted, idem, joiner)

    assert release(counted, call, holder=OTHER) is True

    assert state_of(counted, idem) == KeyState(waiters=True)
    assert begin_call(counted, call) == ("run", "")  # Celery's redelivery
    complete_call(counted, call)
    assert frames(counted, joiner) == [reply_frame(joiner.call_id, OK).encode()]


def test_releasing_a_holder_that_no_longer_holds_the_state_leaves_it(
    counted: redis.Redis, idem: Idempotent
) -> None:
    call = call_of(idem, "call-1")
    begin_call(counted, call, OTHER)

    assert release(counted, call, holder=HOLDER) is False

    assert state_of(counted, idem) == KeyState(holder=OTHER)


# -- outcomes not stored, and repeats --------------------------------------------------


def test_an_outcome_not_stored_frees_the_state_and_the_claim_so_a_retry_runs_again(
    counted: redis.Redis, idem: Idempotent
) -> None:
    call, joiner, retry = call_of(idem, "call-1"), call_of(idem, "call-2"), call_of(idem, "call-3")
    claim_call(counted, idem, call)
    begin_call(counted, call)
    claim_call(counted, idem, joiner)
    failed = '{"ok": false}'

    complete_call(counted, call, failed, store=False)

    assert not counted.exists(idem.state, idem.claim, idem.waiters)
    for caller in (call, joiner):
        assert frames(counted, caller) == [reply_frame(caller.call_id, failed).encode()]
    assert claim_call(counted, idem, retry) == ("claimed", "")
    assert begin_call(counted, retry) == ("run", "")


def test_a_repeat_whose_claim_expired_is_dispatched_once_and_answered_from_the_store(
    counted: redis.Redis, idem: Idempotent
) -> None:
    first, repeat, later = call_of(idem, "call-1"), call_of(idem, "call-2"), call_of(idem, "call-3")
    claim_call(counted, idem, first)
    begin_call(counted, first)
    complete_call(counted, first)
    counted.delete(idem.claim)  # its TTL (deadline + hard limit + margin) ran out

    assert claim_call(counted, idem, repeat) == ("claimed", "")  # dispatched
    state, stored = begin_call(counted, repeat, OTHER)
    complete_call(counted, repeat, stored, store=False, tag=OTHER)  # executor.task's answer

    assert (state, stored) == ("stored", OK)
    assert frames(counted, repeat) == [reply_frame(repeat.call_id, OK).encode()]
    assert state_of(counted, idem) == KeyState(outcome=OK)  # still stored, never run again
    # The repeat's claim stands, so the next repeat is answered by the claim script alone.
    assert counted.get(idem.claim) == repeat.call_id.encode()
    assert claim_call(counted, idem, later) == ("stored", OK)
    assert counted.llen(idem.queue) == 2  # the first call's message and the repeat's
