"""The worker's half of "nothing runs twice": begin and complete a keyed call.

A call is recorded with who holds it (a holder tag): under ``running:<call id>`` by the
worker's heartbeat, for every call the worker has taken, once it has held it for a
moment (only a client whose call has waited that long reads it); and, for an
idempotent call, under ``running:<idempotency key>`` before it starts. Two Lua scripts make each step of an idempotent call atomic:

* **begin**: a stored outcome is returned instead of running; else the call takes the
  running marker; if another live delivery holds it, this one joins as a waiter; if
  the holder is dead (its worker's heartbeat is gone, or its pid on this worker has
  exited), this delivery takes over.
* **complete**: store the outcome (unless it must not be cached), push it to the
  claimant and every waiter, release the claim when nothing was stored, and drop
  the running marker.

A reply is framed ``<call id>\\n<outcome JSON>`` so one stored outcome can be
addressed to every caller that joined it.
"""

from __future__ import annotations

import os
from typing import Any, Literal, cast

import redis
from redis.commands.core import Script

from executor import keys
from executor.identity import parse_holder, worker_id
from executor.protocol import CallRequest

__all__ = ["begin", "complete", "frame", "release"]

_BEGIN = """
local stored = redis.call('GET', KEYS[1])
if stored then return {'stored', stored} end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {'run', ''} end
if ARGV[3] == '1' or redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
  return {'run', ''}
end
redis.call('RPUSH', KEYS[3], ARGV[4])
if redis.call('PTTL', KEYS[3]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[3], ARGV[2]) end
return {'busy', redis.call('GET', KEYS[2]) or ''}
"""

_COMPLETE = """
if ARGV[2] == '1' then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
else
  redis.call('DEL', KEYS[3])
end
local waiters = redis.call('LRANGE', KEYS[2], 0, -1)
redis.call('DEL', KEYS[2])
table.insert(waiters, 1, ARGV[6])
for _, w in ipairs(waiters) do
  local sep = string.find(w, ' ', 1, true)
  if sep and sep > 1 then
    local rkey = ARGV[5] .. string.sub(w, 1, sep - 1)
    redis.call('RPUSH', rkey, string.sub(w, sep + 1) .. '\\n' .. ARGV[1])
    redis.call('EXPIRE', rkey, ARGV[4])
  end
end
if redis.call('GET', KEYS[4]) == ARGV[7] then redis.call('DEL', KEYS[4]) end
redis.call('DEL', KEYS[5])
return #waiters
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

_REPLY_PREFIX = keys.reply("")
# EVALSHA, loading the script again after a Redis restart (redis-py's Script does).
_BEGIN_SCRIPT = Script(cast(Any, None), _BEGIN.encode())
_COMPLETE_SCRIPT = Script(cast(Any, None), _COMPLETE.encode())
_RELEASE_SCRIPT = Script(cast(Any, None), _RELEASE.encode())


def frame(call_id: str, encoded_outcome: str) -> str:
    """A reply as it travels: ``<call id>\\n<outcome JSON>``."""
    return f"{call_id}\n{encoded_outcome}"


def _running_key(call: CallRequest) -> str:
    return keys.running(call.idempotency_key or call.call_id)


def begin(
    client: redis.Redis, call: CallRequest, *, holder: str, hostname: str, ttl_ms: int
) -> tuple[Literal["run", "stored", "busy"], str]:
    """Start a call: ``("run", "")``, ``("stored", outcome JSON)`` or ``("busy", holder)``."""
    if call.idempotency_key is None:
        # No write here: the worker's heartbeat records who runs a plain call once it
        # has run for a moment (executor/catalog.py), keeping a round trip off every call.
        return "run", ""
    key = call.idempotency_key
    keys_ = [keys.outcome(key), keys.running(key), keys.waiters(key)]
    waiter = f"{call.reply_to} {call.call_id}"
    state, value = _decode(_BEGIN_SCRIPT(keys=keys_, args=[holder, ttl_ms, "0", waiter], client=client))
    if state == "busy" and not _alive(client, value, hostname=hostname):
        # The holder died mid-call: take over. Our waiter entry gets the outcome twice
        # at worst (once as claimant), and the client drops the second copy.
        state, value = _decode(_BEGIN_SCRIPT(keys=keys_, args=[holder, ttl_ms, "1", waiter], client=client))
    return state, value  # type: ignore[return-value]


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
    if call.idempotency_key is None:
        # A plain call's holder record (if a heartbeat wrote one) is left to its short
        # TTL: only a caller still waiting reads it, and this one is answered now.
        if call.reply_to:
            reply = keys.reply(call.reply_to)
            pipe = client.pipeline(transaction=False)
            pipe.rpush(reply, frame(call.call_id, encoded))
            pipe.expire(reply, reply_ttl)
            pipe.execute()
        return
    key = call.idempotency_key
    claimant = f"{call.reply_to} {call.call_id}" if call.reply_to else ""
    _COMPLETE_SCRIPT(
        keys=[keys.outcome(key), keys.waiters(key), keys.claim(key), keys.running(key), keys.running(call.call_id)],
        args=[encoded, "1" if store else "0", outcome_ttl * 1000, reply_ttl, _REPLY_PREFIX, claimant, holder],
        client=client,
    )


def release(client: redis.Redis, call: CallRequest, *, holder: str) -> bool:
    """Drop ``call``'s running marker if ``holder`` (a process that died) still holds it.

    Without this a redelivery on another worker would see the marker of a live worker
    and wait for a call that nobody runs.
    """
    return bool(_RELEASE_SCRIPT(keys=[_running_key(call)], args=[holder], client=client))


def _alive(client: redis.Redis, tag: str, *, hostname: str) -> bool:
    if not tag:
        return False
    wid, pid = parse_holder(tag)
    if wid == worker_id(hostname) and pid:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return bool(client.exists(keys.worker(wid)))


def _decode(reply: list[bytes | str]) -> tuple[str, str]:
    state, value = (v.decode() if isinstance(v, bytes) else v for v in reply)
    return state, value
