"""The watchdog's look for a call that is neither held nor answered, on RabbitMQ.

On a Redis broker the watchdog (:mod:`agent_client.watchdog`) looks for such a call in
its queue's list (``LPOS``): neither queued nor held means that the worker that took it
died. RabbitMQ cannot be searched for a message, but it delivers again by itself every
message a consumer that went away had not acknowledged. So the look reads who was last
recorded as holding the call (``running:<call id>``, kept ten intervals, stale or not)
and the heartbeat of the worker it names:

* no record, or a worker that still beats: the call counts as queued (it waits for a
  worker, or its live worker finished it and the reply is on its way). An at-most-once
  call is never acknowledged, nor its tool started, before its holder is recorded
  (:mod:`executor.holding`), so a call without a record is still in RabbitMQ;
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

from typing import Any

from agent_client.callstate import CallState
from agent_client.io import Link, Refused, Unknown
from wire import keys
from wire.formats import parse_holder_tag

__all__ = ["queued_on_amqp"]

#: Seconds the look's commands may take.
_TIMEOUT = 2.0

Placed = tuple[tuple[str, CallState], bool]


async def queued_on_amqp(store: Link, unplaced: list[tuple[str, CallState]]) -> list[Placed]:
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
    placed: list[Placed] = []
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
