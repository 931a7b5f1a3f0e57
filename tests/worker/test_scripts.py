"""wire.scripts: every Lua script, run on the private Redis, and what it leaves behind.

Frames, waiter entries and key states the scripts build in Lua are parsed back with the
functions of :mod:`wire.formats`, so the two cannot drift apart. How an idempotency
key's state goes through a whole call, and what that costs in commands, is
``test_key_state.py``; loading a script the server forgot is ``test_script_loading.py``.
"""

from __future__ import annotations

import pytest
import redis

from tests.redis_stats import calls_of
from wire import keys
from wire.copies import PUSH_ONCE
from wire.formats import (
    KeyState,
    parse_frame,
    reply_frame,
    running_state,
    stored_state,
    waiter_entry,
)
from wire.models import CallOutcome
from wire.scripts import (
    BEGIN,
    CLAIM,
    COMPLETE,
    DELIVER,
    RELEASE,
    RELEASE_HOLDER,
    pair,
    pairs,
)

from .keyed import HOLDER, OTHER, TTL_MS, Idempotent, claim, state_of
from .support import unique


@pytest.fixture
def idem() -> Idempotent:
    return Idempotent()


def begin(
    client: redis.Redis, idem: Idempotent, tag: str, *, take_over: bool = False, waiter: str = ""
) -> tuple[str, str]:
    return pair(
        BEGIN.run(
            client, [idem.state, idem.waiters], [tag, TTL_MS, "1" if take_over else "0", waiter]
        )
    )


def complete(
    client: redis.Redis,
    idem: Idempotent,
    encoded: str,
    *,
    claimant: str,
    tag: str = HOLDER,
    call_record: str = "",
    reply_ttl: int = 30,
) -> int:
    return int(
        COMPLETE.run(
            client,
            [idem.state, idem.waiters, idem.claim, call_record or keys.running(unique("call"))],
            [encoded, reply_ttl, keys.reply(""), claimant, tag],
        )
    )


# -- CLAIM ------------------------------------------------------------------------------


def test_claim_claims_a_free_key_and_pushes_the_message(
    client: redis.Redis, idem: Idempotent
) -> None:
    assert claim(client, idem, "call-1") == ("claimed", "")

    assert client.get(idem.claim) == b"call-1"
    assert 0 < client.pttl(idem.claim) <= TTL_MS
    assert client.lrange(idem.queue, 0, -1) == [b"message of call-1"]
    assert not client.exists(idem.state)  # the worker's to write


def test_claim_without_push_claims_but_leaves_the_queue_alone(
    client: redis.Redis, idem: Idempotent
) -> None:
    assert claim(client, idem, "call-1", push=False) == ("claimed", "")

    assert client.get(idem.claim) == b"call-1"
    assert not client.exists(idem.queue)


def test_claim_of_a_claimed_key_returns_its_stored_outcome_and_pushes_nothing(
    client: redis.Redis, idem: Idempotent
) -> None:
    client.set(idem.claim, "call-0", px=TTL_MS)
    client.set(idem.state, stored_state('{"ok": true}'), px=TTL_MS)

    assert claim(client, idem, "call-1") == ("stored", '{"ok": true}')

    assert client.get(idem.claim) == b"call-0"
    assert not client.exists(idem.queue, idem.waiters)


def test_claim_of_a_free_key_whose_outcome_is_stored_dispatches_for_the_worker_to_answer(
    client: redis.Redis, idem: Idempotent
) -> None:
    # The claim expired before the outcome: the claim is taken without reading the state.
    client.set(idem.state, stored_state('{"ok": true}'), px=TTL_MS)

    assert claim(client, idem, "call-1") == ("claimed", "")

    assert client.lrange(idem.queue, 0, -1) == [b"message of call-1"]
    assert state_of(client, idem).outcome == '{"ok": true}'


def test_claim_of_a_key_nobody_has_begun_joins_and_raises_the_flag_with_no_holder(
    client: redis.Redis, idem: Idempotent
) -> None:
    claim(client, idem, "call-1")

    assert claim(client, idem, "call-2", ttl_ms=TTL_MS) == ("joined", "")

    assert client.lrange(idem.waiters, 0, -1) == [waiter_entry("client-1", "call-2").encode()]
    assert TTL_MS - 1_000 < client.pttl(idem.waiters) <= TTL_MS
    assert client.llen(idem.queue) == 1  # the message went out once
    assert client.get(idem.claim) == b"call-1"
    # The waiter flag: nothing stored yet, nobody running it, and waiters to tell.
    assert state_of(client, idem) == KeyState(waiters=True)
    assert TTL_MS - 1_000 < client.pttl(idem.state) <= TTL_MS


def test_claim_of_a_key_a_delivery_runs_joins_and_flags_its_state_keeping_the_holder(
    client: redis.Redis, idem: Idempotent
) -> None:
    claim(client, idem, "call-1")
    client.set(idem.state, running_state(HOLDER), px=3 * TTL_MS)

    assert claim(client, idem, "call-2", ttl_ms=TTL_MS) == ("joined", "")

    assert state_of(client, idem) == KeyState(holder=HOLDER, waiters=True)
    assert client.pttl(idem.state) > 2 * TTL_MS  # never shortened by a joiner


def test_claim_of_a_batch_answers_each_call_in_order_and_pushes_each_queue_once(
    client: redis.Redis,
) -> None:
    fresh, stored, other = Idempotent(), Idempotent(), Idempotent()
    other.queue = fresh.queue
    client.set(stored.claim, "call-0", px=TTL_MS)
    client.set(stored.state, stored_state('{"ok": true}'), px=TTL_MS)
    calls = [(fresh, "call-1"), (fresh, "call-2"), (stored, "call-3"), (other, "call-4")]
    names: list[str] = []
    arguments: list[str | int] = []
    for idem, call_id in calls:
        names += [idem.claim, idem.state, idem.waiters, idem.queue]
        arguments += [call_id, TTL_MS, f"message of {call_id}", waiter_entry("c", call_id), "1"]
    before = calls_of(client, "lpush")

    answers = pairs(CLAIM.run(client, names, arguments))

    # The first call claims its key; the second, the same key, joins it in the same run.
    assert answers == [("claimed", ""), ("joined", ""), ("stored", '{"ok": true}'), ("claimed", "")]
    # One LPUSH for the queue's two messages, leaving them as two LPUSHes would.
    assert calls_of(client, "lpush") == before + 1
    assert client.lrange(fresh.queue, 0, -1) == [b"message of call-4", b"message of call-1"]
    assert client.lrange(fresh.waiters, 0, -1) == [waiter_entry("c", "call-2").encode()]
    assert not client.exists(stored.queue, stored.waiters)


def test_claim_never_shortens_the_waiters_ttl(client: redis.Redis, idem: Idempotent) -> None:
    claim(client, idem, "call-1")
    client.rpush(idem.waiters, waiter_entry("client-0", "call-0"))
    client.pexpire(idem.waiters, 3 * TTL_MS)

    assert claim(client, idem, "call-2", ttl_ms=TTL_MS) == ("joined", "")

    assert client.pttl(idem.waiters) > 2 * TTL_MS
    assert client.llen(idem.waiters) == 2


# -- BEGIN (run when the begin's SET NX found the state taken) ---------------------------


def test_begin_of_a_state_freed_meanwhile_takes_it(client: redis.Redis, idem: Idempotent) -> None:
    assert begin(client, idem, HOLDER) == ("run", "")

    assert state_of(client, idem) == KeyState(holder=HOLDER)
    assert 0 < client.pttl(idem.state) <= TTL_MS


def test_begin_returns_a_stored_outcome_instead_of_running(
    client: redis.Redis, idem: Idempotent
) -> None:
    client.set(idem.state, stored_state('{"ok": true}'), px=TTL_MS)

    assert begin(client, idem, HOLDER) == ("stored", '{"ok": true}')

    assert state_of(client, idem).outcome == '{"ok": true}'


def test_begin_of_a_call_another_holder_runs_is_busy_and_joins_its_waiters(
    client: redis.Redis, idem: Idempotent
) -> None:
    client.set(idem.state, running_state(OTHER), px=TTL_MS // 2)
    waiter = waiter_entry("client-2", "call-2")

    assert begin(client, idem, HOLDER, waiter=waiter) == ("busy", OTHER)

    assert client.lrange(idem.waiters, 0, -1) == [waiter.encode()]
    assert TTL_MS - 1_000 < client.pttl(idem.waiters) <= TTL_MS
    assert state_of(client, idem) == KeyState(holder=OTHER, waiters=True)
    assert TTL_MS - 1_000 < client.pttl(idem.state) <= TTL_MS


def test_begin_takes_a_state_callers_joined_before_anyone_began_keeping_the_flag(
    client: redis.Redis, idem: Idempotent
) -> None:
    client.set(idem.state, running_state("", waiters=True), px=3 * TTL_MS)

    assert begin(client, idem, HOLDER) == ("run", "")

    assert state_of(client, idem) == KeyState(holder=HOLDER, waiters=True)
    assert client.pttl(idem.state) > 2 * TTL_MS  # the waiters' TTL, not shortened


@pytest.mark.parametrize("waiters", [False, True])
def test_begin_told_the_holder_is_dead_takes_the_state_over(
    client: redis.Redis, idem: Idempotent, waiters: bool
) -> None:
    client.set(idem.state, running_state(OTHER, waiters=waiters), px=1_000)

    assert begin(
        client, idem, HOLDER, take_over=True, waiter=waiter_entry("client-2", "call-2")
    ) == ("run", "")

    # Callers that joined the dead holder stay flagged: this delivery tells them.
    assert state_of(client, idem) == KeyState(holder=HOLDER, waiters=waiters)
    assert client.pttl(idem.state) > 1_000  # the TTL is this delivery's, not the dead one's
    assert not client.exists(idem.waiters)


def test_begin_by_the_holder_itself_runs_again(client: redis.Redis, idem: Idempotent) -> None:
    client.set(idem.state, running_state(HOLDER), px=1_000)

    assert begin(client, idem, HOLDER) == ("run", "")

    assert client.pttl(idem.state) > 1_000
    assert not client.exists(idem.waiters)


def test_begin_reads_a_state_in_no_known_shape_as_a_holder_never_as_free(
    client: redis.Redis, idem: Idempotent
) -> None:
    client.set(idem.state, "garbage", px=TTL_MS)

    assert begin(client, idem, HOLDER) == ("busy", "garbage")


# -- COMPLETE (nothing stored, or answered from the store) ------------------------------


def test_complete_pushes_a_frame_to_the_claimant_and_every_waiter(
    client: redis.Redis, idem: Idempotent
) -> None:
    outcome = CallOutcome.success("call-1", {"seat": "7A"}, worker="w1@host")
    encoded = outcome.model_dump_json()
    callers = [(unique("client"), f"call-{n}") for n in range(1, 4)]
    client.rpush(idem.waiters, *(waiter_entry(r, c) for r, c in callers[1:]))

    pushed = complete(client, idem, encoded, claimant=waiter_entry(*callers[0]), reply_ttl=30)

    assert pushed == 3
    for reply_to, call_id in callers:
        frames = client.lrange(keys.reply(reply_to), 0, -1)
        assert frames == [reply_frame(call_id, encoded).encode()]
        assert isinstance(frames[0], bytes)
        parsed_id, is_progress, body = parse_frame(frames[0])
        assert (parsed_id, is_progress) == (call_id, False)
        assert CallOutcome.model_validate_json(body) == outcome
        assert 0 < client.ttl(keys.reply(reply_to)) <= 30
    assert not client.exists(idem.waiters)


def test_complete_skips_waiter_entries_that_name_no_client(
    client: redis.Redis, idem: Idempotent
) -> None:
    reply_to = unique("client")
    client.rpush(idem.waiters, "no-separator", " call-9", waiter_entry(reply_to, "call-2"))

    complete(client, idem, "{}", claimant="")

    assert client.lrange(keys.reply(reply_to), 0, -1) == [b"call-2\n{}"]
    assert not client.keys(keys.reply("no-separator*"))
    assert not client.exists(keys.reply(""))


@pytest.mark.parametrize(
    "state",
    [running_state(HOLDER), running_state(HOLDER, waiters=True), running_state("", waiters=True)],
    ids=["held by this delivery", "held by it, callers joined", "nobody began, callers joined"],
)
def test_complete_frees_the_claim_and_drops_this_deliverys_state(
    client: redis.Redis, idem: Idempotent, state: str
) -> None:
    client.set(idem.claim, "call-1", px=TTL_MS)
    client.set(idem.state, state, px=TTL_MS)

    complete(client, idem, '{"ok": false}', claimant="", tag=HOLDER)

    assert not client.exists(idem.claim, idem.state)


def test_complete_leaves_the_state_another_delivery_holds(
    client: redis.Redis, idem: Idempotent
) -> None:
    call_record = keys.running(unique("call"))
    client.set(idem.state, running_state(OTHER, waiters=True), px=TTL_MS)
    client.set(call_record, HOLDER, px=TTL_MS)

    complete(client, idem, "{}", claimant="", tag=HOLDER, call_record=call_record)

    assert state_of(client, idem) == KeyState(holder=OTHER, waiters=True)
    assert not client.exists(call_record)  # the call's own heartbeat record goes in any case


def test_complete_answering_from_the_store_keeps_the_stored_outcome_and_the_claim(
    client: redis.Redis, idem: Idempotent
) -> None:
    client.set(idem.state, stored_state('{"ok": true}'), px=TTL_MS)
    client.set(idem.claim, "call-1", px=TTL_MS)
    reply_to = unique("client")

    complete(client, idem, '{"ok": true}', claimant=waiter_entry(reply_to, "call-1"))

    assert state_of(client, idem).outcome == '{"ok": true}'
    # The claim stands: while it lasts, a repeat is answered by the claim script.
    assert client.get(idem.claim) == b"call-1"
    assert client.lrange(keys.reply(reply_to), 0, -1) == [b'call-1\n{"ok": true}']


# -- DELIVER ----------------------------------------------------------------------------


def test_deliver_pushes_the_outcome_to_every_waiter_and_drops_the_list(
    client: redis.Redis, idem: Idempotent
) -> None:
    callers = [(unique("client"), f"call-{n}") for n in range(2)]
    client.rpush(idem.waiters, *(waiter_entry(r, c) for r, c in callers), "no-separator")

    pushed = DELIVER.run(client, [idem.waiters], ['{"ok": true}', 30, keys.reply("")])

    assert pushed == 2
    for reply_to, call_id in callers:
        assert client.lrange(keys.reply(reply_to), 0, -1) == [
            reply_frame(call_id, '{"ok": true}').encode()
        ]
        assert 0 < client.ttl(keys.reply(reply_to)) <= 30
    assert not client.exists(idem.waiters)


def test_deliver_without_waiters_writes_nothing(client: redis.Redis, idem: Idempotent) -> None:
    assert DELIVER.run(client, [idem.waiters], ["{}", 30, keys.reply("")]) == 0

    assert not client.exists(idem.waiters)


# -- RELEASE, RELEASE_HOLDER --------------------------------------------------------------


def test_release_deletes_a_key_only_while_it_holds_the_value(
    client: redis.Redis, idem: Idempotent
) -> None:
    client.set(idem.claim, OTHER)

    assert RELEASE.run(client, [idem.claim], [HOLDER]) == 0
    assert client.get(idem.claim) == OTHER.encode()
    assert RELEASE.run(client, [idem.claim], [OTHER]) == 1
    assert not client.exists(idem.claim)
    assert RELEASE.run(client, [idem.claim], [OTHER]) == 0


def test_release_holder_drops_a_dead_holders_state(client: redis.Redis, idem: Idempotent) -> None:
    client.set(idem.state, running_state(OTHER), px=TTL_MS)

    assert RELEASE_HOLDER.run(client, [idem.state], [OTHER]) == 1

    assert not client.exists(idem.state)


def test_release_holder_keeps_the_flag_of_callers_that_joined_a_dead_holder(
    client: redis.Redis, idem: Idempotent
) -> None:
    client.set(idem.state, running_state(OTHER, waiters=True), px=TTL_MS)

    assert RELEASE_HOLDER.run(client, [idem.state], [OTHER]) == 1

    # Nobody holds it now, and whoever runs it next tells them.
    assert state_of(client, idem) == KeyState(waiters=True)
    assert TTL_MS - 1_000 < client.pttl(idem.state) <= TTL_MS


@pytest.mark.parametrize(
    "state",
    [running_state(HOLDER), running_state(HOLDER, waiters=True), stored_state("{}")],
    ids=["another holder", "another holder, callers joined", "stored"],
)
def test_release_holder_leaves_a_state_the_dead_holder_no_longer_holds(
    client: redis.Redis, idem: Idempotent, state: str
) -> None:
    client.set(idem.state, state, px=TTL_MS)

    assert RELEASE_HOLDER.run(client, [idem.state], [OTHER]) == 0

    assert client.get(idem.state) == state.encode()


# -- PUSH_ONCE --------------------------------------------------------------------------


def test_push_once_pushes_each_new_call_once_in_one_lpush(client: redis.Redis) -> None:
    queue = unique("queue")
    sent = [keys.sent(unique("call")) for _ in range(3)]
    client.set(sent[1], "1", px=TTL_MS)  # pushed before
    before = calls_of(client, "lpush")

    pushed = PUSH_ONCE.run(
        client, [queue, *sent], [TTL_MS, "message 1", TTL_MS, "message 2", TTL_MS, "message 3"]
    )

    assert pushed == [1, 0, 1]
    assert calls_of(client, "lpush") == before + 1
    assert client.lrange(queue, 0, -1) == [b"message 3", b"message 1"]
    assert all(0 < client.pttl(marker) <= TTL_MS for marker in sent)


def test_push_once_of_calls_all_pushed_before_pushes_nothing(client: redis.Redis) -> None:
    queue, marker = unique("queue"), keys.sent(unique("call"))
    client.set(marker, "1", px=TTL_MS)

    assert PUSH_ONCE.run(client, [queue, marker], [TTL_MS, "message"]) == [0]

    assert not client.exists(queue)
