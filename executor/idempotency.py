"""The worker's half of "nothing runs twice": begin and complete a keyed call.

A call is recorded with who holds it (a holder tag, :mod:`wire.formats`): under
``running:<call id>`` by the worker's heartbeat, for every call the worker has taken,
once it has held it for a moment (only a client whose call has waited that long reads
it); and, for an idempotent call, in its key's state (:func:`wire.keys.state`) before
it starts. That one state says who runs the key, whether callers joined, or what
outcome is stored (:func:`wire.formats.parse_state`).

Each step of an idempotent call is atomic where it must be, and its first delivery
sends few commands (:mod:`wire.scripts`):

* **begin**: one ``SET NX`` of the state (this delivery's holder tag). Taken means
  nothing runs the key and nothing is stored: run. Only when the state is taken does
  the begin script decide: a stored outcome is returned instead of running; a state
  nobody has begun (callers joined first) or this process's own stale one is taken; a
  live delivery's is joined as a waiter; a dead holder's (its worker's heartbeat is
  gone, or its pid on this worker has exited) is taken over.
* **complete**: an outcome that is kept goes out in one pipeline: stored in the state
  with ``SET ... GET``, whose previous value says whether anyone joined (then the
  deliver script tells every waiter), and pushed to the claimant. An outcome that is
  not kept (or a delivery answered from the store) goes through the complete script:
  it tells the claimant and every waiter and, unless an outcome is stored, frees the
  claim and drops this delivery's state, so that a retry runs the call again.
"""

from __future__ import annotations

import os
import time
from typing import cast

import redis
from redis.client import Pipeline

from executor.identity import worker_id
from wire import keys
from wire.formats import (
    parse_holder_tag,
    parse_state,
    reply_frame,
    running_state,
    stored_state,
    waiter_entry,
)
from wire.models import CallRequest
from wire.scripts import BEGIN, COMPLETE, DELIVER, RELEASE, RELEASE_HOLDER, BeginState, pair

__all__ = ["begin", "complete", "queue_reply", "release"]

_REPLY_PREFIX = keys.reply("")


def begin(
    client: redis.Redis, call: CallRequest, *, holder: str, hostname: str, ttl_ms: int, patience: float = 0.0
) -> tuple[BeginState, str]:
    """Start a call: ``("run", "")``, ``("stored", outcome JSON)`` or ``("busy", holder)``.

    ``patience`` is how long another worker's heartbeat may be missing before its
    state is taken over (the heartbeat interval): a Redis restart can let every
    heartbeat key lapse for a moment, and a live holder's call must not run twice.
    """
    if call.idempotency_key is None:
        # No write here: the worker's heartbeat records who runs a plain call once it
        # has run for a moment (executor/heartbeat.py), keeping a round trip off every call.
        return "run", ""
    key = call.idempotency_key
    state_key = keys.state(key)
    if client.set(state_key, running_state(holder), nx=True, px=ttl_ms):
        return "run", ""
    keys_ = [state_key, keys.waiters(key)]
    waiter = waiter_entry(call.reply_to, call.call_id)
    state, value = pair(BEGIN.run(client, keys_, [holder, ttl_ms, "0", waiter]))
    if state == "busy" and not _alive(client, value, hostname=hostname, patience=patience):
        # The holder died mid-call: take over. Our waiter entry gets the outcome twice
        # at worst (once as claimant), and the client drops the second copy.
        state, value = pair(BEGIN.run(client, keys_, [holder, ttl_ms, "1", waiter]))
    return cast(BeginState, state), value


def complete(
    client: redis.Redis,
    call: CallRequest,
    encoded: str,
    *,
    store: bool,
    holder: str,
    outcome_ttl: int,
    reply_ttl: int,
) -> None:
    """Deliver ``encoded`` to the caller (and to every joiner of an idempotent call)."""
    if call.idempotency_key is None or store:
        pipe = client.pipeline(transaction=False)
        if call.idempotency_key is not None:
            pipe.set(keys.state(call.idempotency_key), stored_state(encoded), px=outcome_ttl * 1000, get=True)
        # A plain call's holder record (if a heartbeat wrote one) is left to its short
        # TTL: only a caller still waiting reads it, and this one is answered now.
        queue_reply(pipe, call, encoded, reply_ttl=reply_ttl)
        if not len(pipe):
            return
        results = pipe.execute()
        if call.idempotency_key is not None and parse_state(results[0]).waiters:
            # The waiter flag: callers joined this execution; tell each of them.
            DELIVER.run(
                client, [keys.waiters(call.idempotency_key)], [encoded, reply_ttl, _REPLY_PREFIX]
            )
        return
    key = call.idempotency_key
    claimant = waiter_entry(call.reply_to, call.call_id) if call.reply_to else ""
    COMPLETE.run(
        client,
        [keys.state(key), keys.waiters(key), keys.claim(key), keys.running(call.call_id)],
        [encoded, reply_ttl, _REPLY_PREFIX, claimant, holder],
    )


def queue_reply(pipe: Pipeline, call: CallRequest, encoded: str, *, reply_ttl: int) -> None:
    """Queue on ``pipe`` the push of ``encoded`` to ``call``'s caller, if it has a reply
    address, and the refresh of its reply list's TTL."""
    if call.reply_to:
        reply = keys.reply(call.reply_to)
        pipe.rpush(reply, reply_frame(call.call_id, encoded))
        pipe.expire(reply, reply_ttl)


def release(client: redis.Redis, call: CallRequest, *, holder: str) -> bool:
    """Let go of what ``holder`` (a process that died) holds of ``call``, if it still does:
    its key's state, or a plain call's heartbeat record.

    Without this a redelivery on another worker would see the holder of a live worker
    and wait for a call that nobody runs. Callers that joined stay flagged in the
    state, so the delivery that runs the key next tells them.
    """
    if call.idempotency_key is not None:
        return bool(RELEASE_HOLDER.run(client, [keys.state(call.idempotency_key)], [holder]))
    return bool(RELEASE.run(client, [keys.running(call.call_id)], [holder]))


def _alive(client: redis.Redis, tag: str, *, hostname: str, patience: float) -> bool:
    """Whether the process ``tag`` names is alive: its pid here, or its worker's heartbeat.

    A heartbeat key that is missing is looked for again for ``patience`` seconds
    before its worker counts as dead: a beat rewrites it every third of an interval.
    """
    if not tag:
        return False
    wid, pid = parse_holder_tag(tag)
    if wid == worker_id(hostname) and pid:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    give_up = time.monotonic() + patience
    while not client.exists(keys.worker(wid)):
        if time.monotonic() >= give_up:
            return False
        time.sleep(min(0.1, patience / 10))
    return True
