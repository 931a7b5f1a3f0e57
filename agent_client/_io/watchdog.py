"""Notice that a call is lost, at any moment after it was sent, and act: send a copy
again, give it up, dead-letter it.

About once per heartbeat interval the watchdog looks at every call whose send Redis
confirmed at least an interval ago (it runs on the client's I/O thread):

1. **Held by a dead worker.** A worker records who holds each call it has taken (the
   holder tag under :func:`wire.keys.running_keys`): its heartbeat does, every third of
   an interval, and an idempotent call's begin step does, in its key's state, before
   the call starts. A
   holder whose worker no longer beats means the call died with it. A call sent again
   after its worker died keeps that worker in its key's state until a worker begins the
   new copy: while that copy is still in its queue (behind other calls on a busy
   worker), the call is waiting, not lost again.
2. **Taken by a worker that died before recording it.** A call that has waited two
   intervals with no holder recorded is looked for in its queue (``LPOS`` of its exact
   message, from the oldest end). Neither queued nor held means a worker took it and
   vanished before its first heartbeat named it. A live worker that took it names it
   within a third of an interval, and a call that finished has its reply on the way, so
   this is confirmed by a second look an interval later before anything is done. A call
   that joined another caller's execution has no message of its own: it counts as lost
   when neither a holder nor that execution's claim is left.
3. **Stored, but no frame came.** An idempotent call whose key's state holds a stored
   outcome is answered from it (a joined call's frame is lost with a worker that dies
   between storing the outcome and telling its waiters).

**An outage is not a death.** A heartbeat, a holder record and a queued message all
vanish in a Redis restart, and keys lapse while Redis is paused or refuses writes. Two
looks count only if Redis took every one of this client's own liveness writes between
them, on time (:class:`~agent_client._io.writes.Writes`): after an outage the count starts
again, and a live worker rewrites its heartbeat and its records within a third of an
interval of Redis taking writes again. So a call is given up only on evidence gathered
while its worker could have answered.

A lost call is sent again under the same key (at-least-once, until it has been sent
``TOOLEXEC_MAX_DELIVERIES`` times in all; then it is dead-lettered and its caller gets
``WorkerLost`` naming the attempts) or answered with ``WorkerLost`` (at-most-once); an
idempotent call's claim is released first, so a retry in the run can claim it again.
This works for calls with no deadline, and on every pool. An at-most-once call that left
its queue unrecorded while no worker of its queue died (Redis lost it on its way to a
worker in a restart, or lost its outcome) is answered ``ToolOutcomeUnknown`` instead: it
may have run, and no worker was lost.

**On RabbitMQ** a call that is neither held nor answered cannot be looked for in its
queue: RabbitMQ cannot be searched for a message, but it delivers again by itself every
message a consumer that went away had not acknowledged. So the look
(:func:`_queued_on_amqp`) reads who was last recorded as holding the call
(``running:<call id>``, kept ten intervals, stale or not) and the heartbeat of the
worker it names:

* no record, or a worker that still beats: the call counts as queued (it waits for a
  worker, or its live worker finished it and the reply is on its way). An at-most-once
  call is never acknowledged, nor its tool started, before its holder is recorded
  (:mod:`executor.claims`), so a call without a record is still in RabbitMQ;
* a dead worker, but the call was only taken, not started (pid 0 in the record), or is
  at-least-once (acknowledged late): RabbitMQ put it back when the worker's connection
  closed, so it is queued again;
* a dead worker that had started an at-most-once call (a pid in the record): the call
  was acknowledged, or its copy delivered again is refused by the worker that takes it.
  Seen so on two looks an interval apart, it is lost (``WorkerLost``).

RabbitMQ puts a dead consumer's messages back when it notices the connection closed:
at once for a process that died, after the AMQP heartbeat timeout for a host that
vanished from the network. Until then such a call waits, unacknowledged, and a caller
with a deadline hears ``ToolTimeoutError`` at it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pydantic

from agent_client._io.callstate import CallState
from agent_client._io.link import Link, NotSent, Refused, Unknown
from agent_client._io.loop import IOThread
from agent_client._io.replies import ReplyRouter
from agent_client._io.runlog import RunLog
from agent_client._io.writes import Writes
from wire import keys
from wire.clock import shared_now
from wire.copies import GIVE_UP, PUSH_ONCE, RESEND, sent_again
from wire.deadletter import deadletter_commands, deadletter_entry
from wire.formats import parse_holder_tag, parse_state, worker_id_of
from wire.models import CallOutcome, ErrorKind
from wire.resp import Arg
from wire.runlog import RESENT, event
from wire.scripts import RELEASE
from wire.urls import is_amqp_url

logger = logging.getLogger(__name__)
#: Calls looked for in their queue per round at most (the longest-waiting first).
MAX_QUEUE_CHECKS = 1000
#: Seconds one round's commands may take.
_TIMEOUT = 2.0

_DIED = "the worker running this call stopped beating"
_VANISHED = "the call left its queue but no live worker holds it: the worker that took it died"
_ORPHANED = "the execution this call joined was lost with its worker"
_UNKNOWN = (
    "the call left its queue, but no live worker holds it and no worker of its queue died: Redis "
    "lost it on its way to a worker or lost its outcome (a restart?), so it may or may not have run"
)


class Watchdog:
    """Finds lost calls among the long-waiting ones; the client's I/O thread runs it.

    Args:
        router: The reply router, which knows the waiting calls.
        io: The client's I/O thread.
        store_url: The Redis of holders, heartbeats and claims.
        broker_url: The Redis of the queues, or RabbitMQ (:func:`_queued_on_amqp`).
        interval: The workers' heartbeat interval.
        writes: Whether Redis has been taking this client's writes: two looks count
            only if it took them all between (:mod:`agent_client._io.writes`).
        max_deliveries: How many times in all an at-least-once call is sent before
            it is given up (``TOOLEXEC_MAX_DELIVERIES``).
        worker_gone: ``await worker_gone(queue, since)``: whether a worker of ``queue``
            stopped beating at or after ``since`` (``time.monotonic()``) and is still
            gone (None: not known yet, asked again next round). Without it, a call that
            vanished is taken to have died with a worker.
        beating_since: ``await beating_since(queue, since)``: whether every worker of
            ``queue`` has beaten since ``since``.
        runlog: Where a call sent again is logged (``wire.runlog.RESENT``).
    """

    def __init__(
        self,
        router: ReplyRouter,
        io: IOThread,
        *,
        store_url: str,
        broker_url: str,
        interval: float,
        writes: Writes,
        max_deliveries: int = 3,
        worker_gone: Callable[[str, float], Awaitable[bool | None]] | None = None,
        beating_since: Callable[[str, float], Awaitable[bool]] | None = None,
        runlog: RunLog | None = None,
    ) -> None:
        self._router = router
        self._runlog = runlog
        self._io = io
        self._store_url = store_url
        self._broker_url = broker_url
        self._interval = interval
        self._writes = writes
        self._max_deliveries = max_deliveries
        self._worker_gone = worker_gone
        self._beating_since = beating_since

    async def check(self) -> None:
        """One round: find the lost calls among those that waited long enough, and act."""
        watched = self._router.watched(waited=self._interval)
        if not watched:
            return
        store = self._io.link(self._store_url, "read")
        now = time.monotonic()
        lost: list[tuple[str, CallState, str]] = []
        seen = await self._holders(store, watched)
        beats = await self._beats(
            store, [tag for look in seen for tag in (look.record, look.marker) if tag]
        )

        def beating(tag: bytes | str | None) -> bool:
            return tag is not None and beats.get(worker_id_of(tag)) is not None

        unplaced: list[tuple[str, CallState]] = []
        resent: list[tuple[str, CallState]] = []
        amqp = is_amqp_url(self._broker_url)
        for (call_id, state), look in zip(watched, seen, strict=True):
            # A record its live worker no longer rewrites names a call that worker no longer
            # holds (it finished, or went back on its queue); one whose worker stopped
            # beating still names the worker that took the call and died with it.
            record = (
                look.record
                if look.record is not None and (look.fresh or not beating(look.record))
                else None
            )
            if look.stored is not None:
                # Its key's outcome is stored, but this call's frame never came (for a
                # joined call: its worker died between storing and telling the waiters).
                self._settle_from_store(call_id, look.stored)
            elif state.joined:
                # Another caller's execution: its claimant watches its message. This call
                # is lost only once that execution's claim is gone and nobody runs it.
                if look.claim or beating(look.marker):
                    state.absent_since = None
                elif self._absent_twice(state, now):
                    lost.append((call_id, state, _ORPHANED))
            elif record is not None or (look.marker is not None and not beating(look.marker)):
                # Held: every delivery of this call carries its id, so its worker's
                # heartbeat names it while it runs (or waits for a process); an
                # idempotent call's marker names who began it. A holder whose worker has
                # stopped beating is dead only when a second look an interval later
                # agrees: a Redis restart can let every heartbeat lapse for a moment.
                if beating(record if record is not None else look.marker):
                    state.absent_since = None
                elif (state.resent and (record is None or not look.fresh)) or (
                    record is not None and amqp
                ):
                    # The key's state, or a record no longer rewritten, names the worker that
                    # died with an earlier copy until a worker takes the copy sent again:
                    # that copy may still wait in its queue behind other calls. Lost only
                    # if it is not there (a fresh record of a dead worker is a new death). On
                    # RabbitMQ a dead worker's call may be back in its queue too: the
                    # record says whether (_queued_on_amqp).
                    resent.append((call_id, state))
                elif self._absent_twice(state, now):
                    lost.append((call_id, state, _DIED))
            elif now - state.since >= 2 * self._interval:
                unplaced.append((call_id, state))
        # One look in the queues for both: the unplaced and the copies sent again.
        looked_for = [(item, _VANISHED) for item in unplaced] + [(item, _DIED) for item in resent]
        why_lost = {call_id: why for (call_id, _), why in looked_for}
        for (call_id, state), queued in await self._queued([item for item, _ in looked_for]):
            if queued:
                state.absent_since = None
            elif self._absent_twice(state, now):
                lost.append((call_id, state, why_lost[call_id]))
        for call_id, state, why in lost:
            await self._lost(store, call_id, state, why)

    def _settle_from_store(self, call_id: str, stored: str) -> None:
        try:
            outcome = CallOutcome.model_validate_json(stored)
        except pydantic.ValidationError:
            return  # not an outcome: left to the other checks on the next round
        self._router.settle(call_id, outcome.for_call(call_id))

    def _absent_twice(self, state: CallState, now: float) -> bool:
        # Two looks an interval apart, while Redis took this client's writes all between:
        # a live worker names what it took (and beats) within a third of an interval, and
        # a finished call's reply reaches the listener in between. A look before a Redis
        # stall, restart or full memory proves nothing after it: the count starts again.
        if state.absent_since is None or not self._writes.steady_since(state.absent_since):
            state.absent_since, state.absent_epoch = now, shared_now()
            return False
        return now - state.absent_since >= self._interval * 0.99

    async def _holders(self, store: Link, watched: list[tuple[str, CallState]]) -> list[_Look]:
        # The record under the call's id is the heartbeat's, rewritten every third of an
        # interval while its worker holds the call; whether it is fresh (rewritten within
        # an interval) is read beside it (check() says what a stale one means). The
        # idempotency key's state, written when the call begins and not rewritten, tells
        # a dead worker fast, and holds the outcome once it is stored.
        names: list[Arg] = []
        for _, state in watched:
            names += state.running_keys
            if state.joined and state.idempotency_key is not None:
                names.append(keys.claim(state.idempotency_key))
        commands: list[tuple[Arg, ...]] = [("MGET", *names)]
        commands += [("PTTL", state.running_keys[-1]) for _, state in watched]
        # This client's own key beside the look: missing, Redis restarted or stalled.
        commands.append(("EXISTS", self._writes.key))
        replies = await store.execute(commands, timeout=_TIMEOUT)
        witness = replies.pop()
        if not isinstance(witness, Unknown | Refused):
            self._writes.seen(exists=bool(witness))
        values = iter(_values(replies[:1], len(names)))
        fresh_after = (keys.HELD_MARKER_BEATS - 1) * self._interval * 1000
        seen: list[_Look] = []
        for (_, state), ttl in zip(watched, replies[1:], strict=True):
            key_state = parse_state(next(values)) if len(state.running_keys) > 1 else None
            record = state.seen_holder = next(values)
            fresh = not (isinstance(ttl, int) and ttl < fresh_after)
            claim = False
            if state.joined and state.idempotency_key is not None:
                claim = bool(next(values))
            seen.append(
                _Look(
                    record=record,
                    fresh=fresh,
                    claim=claim,
                    marker=key_state.holder or None if key_state is not None else None,
                    stored=key_state.outcome if key_state is not None else None,
                )
            )
        return seen

    async def _beats(self, store: Link, holders: list[bytes | str]) -> dict[str, Any]:
        worker_ids = sorted({worker_id_of(h) for h in holders})
        if not worker_ids:
            return {}
        command = ("MGET", *(keys.worker(w) for w in worker_ids))
        found = _values(await store.execute([command], timeout=_TIMEOUT), len(worker_ids))
        return dict(zip(worker_ids, found, strict=True))

    async def _queued(self, unplaced: list[tuple[str, CallState]]) -> list[_Placed]:
        if not unplaced:
            return []
        unplaced = sorted(unplaced, key=lambda item: item[1].since)[:MAX_QUEUE_CHECKS]
        if is_amqp_url(self._broker_url):  # RabbitMQ cannot be searched for a message
            return await _queued_on_amqp(self._io.link(self._store_url, "read"), unplaced)
        broker = self._io.link(self._broker_url, "read")
        # From the oldest end: a call that waited this long sits near it, if it is there.
        # The latest copy pushed, and, for a call never sent again, the copy a worker put
        # back (wire.copies): either text is the call, queued.
        commands: list[tuple[Arg, ...]] = []
        looks: list[int] = []
        for _, state in unplaced:
            texts = (
                [state.pushed] if state.resent else [state.pushed, sent_again(state.envelope, 0)]
            )
            commands += [("LPOS", state.queue, text, "RANK", -1) for text in texts]
            looks.append(len(texts))
        positions = iter(await broker.execute(commands, timeout=_TIMEOUT))
        placed: list[_Placed] = []
        for item, count in zip(unplaced, looks, strict=True):
            found = [next(positions) for _ in range(count)]
            if not any(isinstance(position, Unknown | Refused) for position in found):
                placed.append((item, any(position is not None for position in found)))
        return placed

    async def _lost(self, store: Link, call_id: str, state: CallState, why: str) -> None:
        if (
            why == _VANISHED
            and self._beating_since is not None
            and not await self._beating_since(state.queue, state.absent_epoch)
        ):
            # A worker of its queue has not beaten since the call was first missed: it may
            # hold the call and not have recorded it yet (its heartbeat stalled: a tool
            # holding the interpreter's lock, a Redis out of memory). Asked again next round.
            return
        error_type = "WorkerLost"
        if state.delivery == "at_least_once":
            if state.resent + 1 < self._max_deliveries:
                if await send_again(self._io, store, self._broker_url, call_id, state):
                    logger.warning(
                        "call %s is lost (%s); sending it again under the same key", call_id, why
                    )
                    state.resent += 1
                    state.since, state.absent_since = time.monotonic(), None
                    if self._runlog is not None and state.run:
                        entry = event(RESENT, call_id, {"generation": state.resent})
                        self._runlog.add(state.run, entry)
                return
            why = (
                f"{why}; it was sent {state.resent + 1} times (TOOLEXEC_MAX_DELIVERIES) and lost "
                "with its worker each time, and is given up"
            )
            if not state.joined:  # a joined call has no message of its own
                await dead_letter(store, call_id, state)
        elif why == _VANISHED and self._worker_gone is not None:
            gone = await self._worker_gone(state.queue, state.since)
            if gone is None:
                return  # a worker of its queue is missing, not yet for long: next round
            if not gone:
                # No worker took it and died: it may have run, and no worker was lost.
                why, error_type = _UNKNOWN, "ToolOutcomeUnknown"
        if not state.joined and not await give_up(store, call_id, state):
            return  # a worker has recorded it held since the look: not lost
        logger.warning("call %s is lost: %s", call_id, why)
        if state.idempotency_key is not None:
            # Nothing will finish this execution: let a retry in the run claim it again.
            release = RELEASE.command([keys.claim(state.idempotency_key)], [call_id])
            await store.execute([release], timeout=_TIMEOUT)
        lost = CallOutcome.failure(call_id, ErrorKind.WORKER_LOST, error_type, why)
        self._router.settle(call_id, lost)


#: A call the watchdog looked for, and whether it may still be queued.
_Placed = tuple[tuple[str, CallState], bool]


@dataclass(frozen=True, slots=True)
class _Look:
    """What one look found of a call: its heartbeat record and whether it is fresh, the
    holder in its key's state, its claim (for a joined call), and the outcome stored in
    its key's state."""

    record: bytes | None
    fresh: bool
    marker: str | None
    claim: bool
    stored: str | None = None


def _values(replies: list[Any], count: int) -> list[Any]:
    reply = replies[0]
    if isinstance(reply, Unknown | Refused):
        raise NotSent(f"could not read from Redis: {reply.error}")
    assert isinstance(reply, list) and len(reply) == count
    return reply


async def _queued_on_amqp(store: Link, unplaced: list[tuple[str, CallState]]) -> list[_Placed]:
    """For each call neither held nor answered: whether it may still be queued on RabbitMQ.

    Calls whose records could not be read are left out (nothing is concluded of them).
    """
    if not unplaced:
        return []
    names = [state.running_keys[-1] for _, state in unplaced]
    records = await _mget(store, names)
    if records is None:
        return []
    holders = {parse_holder_tag(r)[0] for r in records if r}
    beats: dict[str, Any] = {}
    if holders:
        ordered = sorted(holders)
        found = await _mget(store, [keys.worker(w) for w in ordered])
        if found is None:
            return []
        beats = dict(zip(ordered, found, strict=True))
    placed: list[_Placed] = []
    for item, record in zip(unplaced, records, strict=True):
        _, state = item
        if not record:
            placed.append((item, True))
            continue
        worker, pid = parse_holder_tag(record)
        redelivered = pid == 0 or state.delivery == "at_least_once"
        placed.append((item, beats.get(worker) is not None or redelivered))
    return placed


async def _mget(store: Link, names: list[str]) -> list[Any] | None:
    reply = (await store.execute([("MGET", *names)], timeout=_TIMEOUT))[0]
    if (
        isinstance(reply, Unknown | Refused)
        or not isinstance(reply, list)
        or len(reply) != len(names)
    ):
        return None
    return reply


# -- acting on a lost call -------------------------------------------------------------
#
# Both ways of acting on a lost call write its fence first (wire.copies), and do so only
# if no worker has recorded the call held since the watchdog looked: a copy sent again is
# the next generation, so no earlier copy starts once it is out; a call given up is
# fenced for good, so no copy starts at all. A Redis that refuses the write (out of
# memory) leaves the call as it was, to be looked at again next round.


async def give_up(store: Link, call_id: str, state: CallState) -> bool:
    """Fence the call (no copy of it may start from now on), unless a worker has recorded
    it held since the last look; whether it was given up.

    Raises:
        NotSent: Redis did not take the fence (the call is looked at again next round).
    """
    seen = state.seen_holder or b""
    command = GIVE_UP.command(
        [keys.fence(call_id), keys.running(call_id)], [state.fence_ttl_ms, seen]
    )
    reply = (await store.execute([command], timeout=_TIMEOUT))[0]
    if isinstance(reply, Unknown | Refused):
        raise NotSent(f"could not give call {call_id} up: {reply.error}")
    if reply:
        return True
    state.absent_since = None  # held since the look: not lost
    return False


async def send_again(
    io: IOThread, store: Link, broker_url: str, call_id: str, state: CallState
) -> bool:
    """Send a lost at-least-once call again: its next generation, after the fence; whether sent.

    A joined call (no message of its own) claims again through the publisher; so does
    every call on RabbitMQ, which publishes the same message again.
    """
    if state.joined or is_amqp_url(broker_url):
        # No message of our own: claim again (or join, or get the stored outcome).
        # On RabbitMQ: publish again through the publisher (agent_client._io.amqp_lane).
        if state.resend is None:
            return False
        state.confirmed = False
        state.resend()
        return True
    # The next generation: the fence first (earlier copies may no longer start; not if a
    # worker has recorded the call held since the look), then the copy, pushed once
    # under its own sent marker.
    generation = state.resent + 1
    seen = state.seen_holder or b""
    fence = RESEND.command(
        [keys.fence(call_id), keys.running(call_id)], [generation, state.fence_ttl_ms, seen]
    )
    reply = (await store.execute([fence], timeout=_TIMEOUT))[0]
    if isinstance(reply, Unknown | Refused) or not reply:
        if not isinstance(reply, Unknown | Refused):
            state.absent_since = None  # held since: not lost
        return False
    copy = sent_again(state.envelope, generation)
    push = PUSH_ONCE.command(
        [state.queue, keys.sent_copy(call_id, generation)], [state.fence_ttl_ms, copy]
    )
    reply = (await io.link(broker_url, "read").execute([push], timeout=_TIMEOUT))[0]
    if isinstance(reply, Unknown | Refused):
        return False  # the fence names it: the next round pushes it, once
    state.pushed = copy
    return True


async def dead_letter(store: Link, call_id: str, state: CallState) -> None:
    """Dead-letter an at-least-once call given up after its workers died on every delivery."""
    entry = deadletter_entry(
        "worker_lost",
        queue=state.queue,
        payload=state.envelope,
        call_id=call_id,
        detail=f"its worker died on each of {state.resent + 1} deliveries (client watchdog)",
    )
    try:
        replies = await store.execute(deadletter_commands(entry), timeout=_TIMEOUT)
    except NotSent:
        replies = [None]
    if any(reply is None or isinstance(reply, Unknown | Refused) for reply in replies):
        logger.error("could not dead-letter lost call %s", call_id)
