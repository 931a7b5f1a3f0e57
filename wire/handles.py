"""A submitted call's record, which any process can attach to: its fields and its scripts.

``RemoteTool.submit`` sends a call with ``CallRequest.handle`` set and writes its record,
``toolexec:handle:<call id>`` (a hash), before the message goes out: what it is (``tool``,
``queue``, ``deadline``, ``envelope``: the message as pushed, so that a cancel can take
it back off its queue; ``sender``: the submitting process's waiter entry) and how far it
got (``status``: :data:`Status`). The worker that takes it marks it
``running`` (:data:`START`); whoever ends it (the worker; the client's watchdog for a lost
call; a cancel that took it off its queue) writes its outcome and last status, and tells
every process attached to it (:data:`END`: the first end wins). A process that attaches
(``agent_client.attach``) either finds the outcome, or adds its waiter entry to
``toolexec:handle-waiters:<call id>`` and waits for its frame on its own reply list
(:data:`JOIN`). The record lives ``TOOLEXEC_HANDLE_TTL`` from its last change.

Plain calls (``invoke``, ``run``) have no record and pay nothing for it.
"""

from __future__ import annotations

from typing import Final, Literal

from wire.scripts import PUSH_FRAMES, LuaScript

__all__ = [
    "END",
    "ENDED",
    "JOIN",
    "START",
    "Status",
    "status_of",
]

#: What a submitted call's ``status()`` says (``unknown``: nothing is kept of it).
Status = Literal["queued", "running", "done", "failed", "cancelled", "expired", "unknown"]

#: The statuses after which nothing changes.
ENDED: Final = frozenset({"done", "failed", "cancelled", "expired"})


def status_of(ok: bool, kind: str | None) -> Status:
    """The last status of a call whose outcome is ``ok``, or an error of ``kind``
    (an ``ErrorKind`` value)."""
    if ok:
        return "done"
    if kind == "cancelled":
        return "cancelled"
    if kind == "expired":
        return "expired"
    return "failed"


_ENDED_LUA = "{" + ", ".join(f"['{s}'] = true" for s in sorted(ENDED)) + "}"

# KEYS: the record. ARGV: the worker's name, when (epoch s), the record's TTL in ms.
# Marks a queued call running (nothing else: an ended call stays ended). Returns 1 if it did.
START = LuaScript(
    "handle_start",
    """
if redis.call('HGET', KEYS[1], 'status') ~= 'queued' then return 0 end
redis.call('HSET', KEYS[1], 'status', 'running', 'worker', ARGV[1], 'started_at', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
""",
)

# KEYS: the record, its waiters. ARGV: the last status, the outcome JSON, when (epoch s),
# the record's TTL in ms, the reply TTL in s, the reply lists' key prefix, and 1 to tell
# the process that submitted it too (its waiter entry is the record's ``sender``; the
# worker tells it on its own, a cancel or a watchdog elsewhere does not).
# Ends the call once: stores its outcome and status and pushes the outcome to every
# attached process. Returns 1 if it ended it, 0 if it had ended before.
END = LuaScript(
    "handle_end",
    PUSH_FRAMES
    + f"""
local ended = {_ENDED_LUA}
if ended[redis.call('HGET', KEYS[1], 'status') or ''] then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 'outcome', ARGV[2], 'ended_at', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
local waiters = redis.call('LRANGE', KEYS[2], 0, -1)
if ARGV[7] == '1' then
  local sender = redis.call('HGET', KEYS[1], 'sender')
  if sender then waiters[#waiters + 1] = sender end
end
push_frames(waiters, ARGV[2], ARGV[6], ARGV[5])
redis.call('DEL', KEYS[2])
return 1
""",
)

# KEYS: the record, its waiters. ARGV: the attaching process's waiter entry, the TTL in ms.
# Returns {'unknown', ''} (no record), {'ended', outcome JSON}, or {'waiting', status}
# (the entry added: the outcome's frame will come).
JOIN = LuaScript(
    "handle_join",
    f"""
local ended = {_ENDED_LUA}
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {{'unknown', ''}} end
if ended[status] then return {{'ended', redis.call('HGET', KEYS[1], 'outcome') or ''}} end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return {{'waiting', status}}
""",
)
