"""Notice that a call is lost, at any moment after it was sent, and act.

About once per heartbeat interval the watchdog looks at every call whose send Redis
confirmed at least an interval ago (it runs on the client's I/O thread):

1. **Held by a dead worker.** A worker records who holds each call it has taken (the
   holder tag under :func:`wire.keys.running_keys`): its heartbeat does, every third of
   an interval, and an idempotent call's begin step does, in its key's state, before
   the call starts. A
   holder whose worker no longer beats means the call died with it.
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

A lost call is sent again under the same key (at-least-once, until it has been sent
``TOOLEXEC_MAX_DELIVERIES`` times in all; then it is dead-lettered and its caller gets
``WorkerLost`` naming the attempts) or answered with ``WorkerLost`` (at-most-once); an
idempotent call's claim is released first, so a retry in the run can claim it again. This works for calls with
no deadline, and on every pool. An at-most-once call that left its queue unrecorded
while no worker of its queue died (Redis lost it on its way to a worker in a restart,
or lost its outcome) is answered ``ToolOutcomeUnknown`` instead: it may have run, and
no worker was lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pydantic

from agent_client.amqp_watch import queued_on_amqp
from agent_client.brokers import is_amqp_url
from agent_client.callstate import CallState
from agent_client.io import Arg, IOThread, Link, NotSent, Refused, Unknown
from agent_client.replies import ReplyRouter
from wire import keys
from wire.deadletter import deadletter_commands, deadletter_entry
from wire.formats import parse_state, worker_id_of
from wire.models import CallOutcome, ErrorKind
from wire.scripts import RELEASE

__all__ = ["MAX_QUEUE_CHECKS", "Watchdog"]

logger = logging.getLogger(__name__)
#: Calls looked for in their queue per round at most (the longest-waiting first).
MAX_QUEUE_CHECKS = 1000
#: Seconds one round's commands may take.
_TIMEOUT = 2.0

_DIED = "the worker running this call stopped beating"
_VANISHED = "the call left its queue but no live worker holds it: the worker that took it died"
_ORPHANED = "the execution this call joined was lost with its worker"
_UNKNOWN = (
    "the call left its queue, but no live worker holds it and no worker of its queue died: Redis lost it "
    "on its way to a worker or lost its outcome (a restart?), so it may or may not have run"
)


class Watchdog:
    """Finds lost calls among the long-waiting ones; the client's I/O thread runs it.

    Args:
        router: The reply router, which knows the waiting calls.
        io: The client's I/O thread.
        store_url: The Redis of holders, heartbeats and claims.
        broker_url: The Redis of the queues, or RabbitMQ (:mod:`agent_client.amqp_watch`).
        interval: The workers' heartbeat interval.
        max_deliveries: How many times in all an at-least-once call is sent before
            it is given up (``TOOLEXEC_MAX_DELIVERIES``).
        worker_gone: ``await worker_gone(queue, since)``: whether a worker of ``queue``
            stopped beating at or after ``since`` (``time.monotonic()``) and is still
            gone. Without it, a call that vanished is taken to have died with a worker.
    """

    def __init__(
        self, router: ReplyRouter, io: IOThread, *, store_url: str, broker_url: str, interval: float,
        max_deliveries: int = 3, worker_gone: Callable[[str, float], Awaitable[bool]] | None = None,
    ) -> None:  # fmt: skip
        self._router = router
        self._io = io
        self._store_url = store_url
        self._broker_url = broker_url
        self._interval = interval
        self._max_deliveries = max_deliveries
        self._worker_gone = worker_gone

    async def check(self) -> None:
        """One round: find the lost calls among those that waited long enough, and act."""
        watched = self._router.watched(waited=self._interval)
        if not watched:
            return
        store = self._io.link(self._store_url, "read")
        now = time.monotonic()
        lost: list[tuple[str, CallState, str]] = []
        seen = await self._holders(store, watched)
        beats = await self._beats(store, [tag for look in seen for tag in (look.record, look.marker) if tag])

        def beating(tag: bytes | str | None) -> bool:
            return tag is not None and beats.get(worker_id_of(tag)) is not None

        unplaced: list[tuple[str, CallState]] = []
        for (call_id, state), look in zip(watched, seen, strict=True):
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
            elif look.record is not None or (look.marker is not None and not beating(look.marker)):
                # Held: every delivery of this call carries its id, so its worker's
                # heartbeat names it while it runs (or waits for a process); an
                # idempotent call's marker names who began it. A holder whose worker has
                # stopped beating is dead only when a second look an interval later
                # agrees: a Redis restart can let every heartbeat lapse for a moment.
                if beating(look.record if look.record is not None else look.marker):
                    state.absent_since = None
                elif self._absent_twice(state, now):
                    lost.append((call_id, state, _DIED))
            elif now - state.since >= 2 * self._interval:
                unplaced.append((call_id, state))
        for (call_id, state), queued in await self._queued(unplaced):
            if queued:
                state.absent_since = None
            elif self._absent_twice(state, now):
                lost.append((call_id, state, _VANISHED))
        for call_id, state, why in lost:
            await self._lost(store, call_id, state, why)

    def _settle_from_store(self, call_id: str, stored: str) -> None:
        try:
            outcome = CallOutcome.model_validate_json(stored)
        except pydantic.ValidationError:
            return  # not an outcome: left to the other checks on the next round
        self._router.settle(call_id, outcome.for_call(call_id))

    def _absent_twice(self, state: CallState, now: float) -> bool:
        # Two looks an interval apart: a live worker names what it took within a third of
        # one, and a finished call's reply reaches the listener in between.
        if state.absent_since is None:
            state.absent_since = now
            return False
        return now - state.absent_since >= self._interval * 0.99

    async def _holders(self, store: Link, watched: list[tuple[str, CallState]]) -> list[_Look]:
        # The record under the call's id is the heartbeat's, rewritten every third of an
        # interval while its worker holds the call. One not rewritten for an interval names
        # a call its (live) worker no longer holds: finished, or dropped when its broker
        # connection was lost. Only a fresh one counts. The idempotency key's state,
        # written when the call begins and not rewritten, tells a dead worker fast, and
        # holds the outcome once it is stored.
        names: list[Arg] = []
        for _, state in watched:
            names += state.running_keys
            if state.joined and state.idempotency_key is not None:
                names.append(keys.claim(state.idempotency_key))
        commands: list[tuple[Arg, ...]] = [("MGET", *names)]
        commands += [("PTTL", state.running_keys[-1]) for _, state in watched]
        replies = await store.execute(commands, timeout=_TIMEOUT)
        values = iter(_values(replies[:1], len(names)))
        fresh_after = (keys.HELD_MARKER_BEATS - 1) * self._interval * 1000
        seen: list[_Look] = []
        for (_, state), ttl in zip(watched, replies[1:], strict=True):
            key_state = parse_state(next(values)) if len(state.running_keys) > 1 else None
            record = next(values)
            if isinstance(ttl, int) and ttl < fresh_after:
                record = None  # stale: nobody holds it any more
            claim = False
            if state.joined and state.idempotency_key is not None:
                claim = bool(next(values))
            seen.append(
                _Look(
                    record=record, claim=claim,
                    marker=key_state.holder or None if key_state is not None else None,
                    stored=key_state.outcome if key_state is not None else None,
                )
            )  # fmt: skip
        return seen

    async def _beats(self, store: Link, holders: list[bytes | str]) -> dict[str, Any]:
        worker_ids = sorted({worker_id_of(h) for h in holders})
        if not worker_ids:
            return {}
        command = ("MGET", *(keys.worker(w) for w in worker_ids))
        found = _values(await store.execute([command], timeout=_TIMEOUT), len(worker_ids))
        return dict(zip(worker_ids, found, strict=True))

    async def _queued(self, unplaced: list[tuple[str, CallState]]) -> list[tuple[tuple[str, CallState], bool]]:
        if not unplaced:
            return []
        unplaced = sorted(unplaced, key=lambda item: item[1].since)[:MAX_QUEUE_CHECKS]
        if is_amqp_url(self._broker_url):  # RabbitMQ cannot be searched for a message
            return await queued_on_amqp(self._io.link(self._store_url, "read"), unplaced)
        broker = self._io.link(self._broker_url, "read")
        # From the oldest end: a call that waited this long sits near it, if it is there.
        commands = [("LPOS", state.queue, state.envelope, "RANK", -1) for _, state in unplaced]
        positions = await broker.execute(commands, timeout=_TIMEOUT)
        return [
            (item, position is not None)
            for item, position in zip(unplaced, positions, strict=True)
            if not isinstance(position, Unknown | Refused)
        ]

    async def _lost(self, store: Link, call_id: str, state: CallState, why: str) -> None:
        error_type = "WorkerLost"
        if state.delivery == "at_least_once":
            if state.resent + 1 < self._max_deliveries:
                if await self._send_again(state):
                    logger.warning("call %s is lost (%s); sending it again under the same key", call_id, why)
                    state.resent += 1
                    state.since, state.absent_since = time.monotonic(), None
                return
            why = (
                f"{why}; it was sent {state.resent + 1} times (TOOLEXEC_MAX_DELIVERIES) and lost "
                "with its worker each time, and is given up"
            )
            if not state.joined:  # a joined call has no message of its own
                await self._dead_letter(store, call_id, state)
        elif why == _VANISHED and self._worker_gone is not None and not await self._worker_gone(state.queue, state.since):
            # No worker took it and died: it may have run, and no worker was lost.
            why, error_type = _UNKNOWN, "ToolOutcomeUnknown"
        logger.warning("call %s is lost: %s", call_id, why)
        if state.idempotency_key is not None:
            # Nothing will finish this execution: let a retry in the run claim it again.
            release = RELEASE.command([keys.claim(state.idempotency_key)], [call_id])
            await store.execute([release], timeout=_TIMEOUT)
        lost = CallOutcome.failure(call_id, ErrorKind.WORKER_LOST, error_type, why)
        self._router.settle(call_id, lost)

    async def _dead_letter(self, store: Link, call_id: str, state: CallState) -> None:
        entry = deadletter_entry(
            "worker_lost", queue=state.queue, payload=state.envelope, call_id=call_id,
            detail=f"its worker died on each of {state.resent + 1} deliveries (client watchdog)",
        )  # fmt: skip
        try:
            replies = await store.execute(deadletter_commands(entry), timeout=_TIMEOUT)
        except NotSent:
            replies = [None]
        if any(reply is None or isinstance(reply, Unknown | Refused) for reply in replies):
            logger.error("could not dead-letter lost call %s", call_id)

    async def _send_again(self, state: CallState) -> bool:
        if state.joined or is_amqp_url(self._broker_url):
            # No message of our own: claim again (or join, or get the stored outcome).
            # On RabbitMQ: publish again through the publisher (agent_client.amqp).
            if state.resend is None:
                return False
            state.confirmed = False
            state.resend()
            return True
        broker = self._io.link(self._broker_url, "read")
        # The same envelope, past its sent marker: this push is meant to queue it again.
        reply = (await broker.execute([("LPUSH", state.queue, state.envelope)], timeout=_TIMEOUT))[0]
        return not isinstance(reply, Unknown | Refused)


@dataclass(frozen=True, slots=True)
class _Look:
    """What one look found of a call: its fresh heartbeat record, the holder in its key's
    state, its claim (for a joined call), and the outcome stored in its key's state."""

    record: bytes | None
    marker: str | None
    claim: bool
    stored: str | None = None


def _values(replies: list[Any], count: int) -> list[Any]:
    reply = replies[0]
    if isinstance(reply, Unknown | Refused):
        raise NotSent(f"could not read from Redis: {reply.error}")
    assert isinstance(reply, list) and len(reply) == count
    return reply
