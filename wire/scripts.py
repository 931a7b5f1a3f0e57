"""Every Lua script toolexec runs in Redis, and the one way they are run.

An idempotent call's first delivery costs few commands (counted in
``bench/scenarios/redis_commands.py`` and ``tests/integration/test_command_counts.py``):
the client's **claim** script (``SET NX`` of the claim, the push of the message), then
on the worker one begin (``SET NX`` of the key's state) and one pipelined complete
(``SET`` the stored outcome ``GET`` the state it replaces, push the claimant's reply
frame); the scripts below take the other paths. Every call of one batch is claimed by
one script run, and the messages a run pushes onto one queue go in one ``LPUSH``.

**One state per key.** The worker keeps one record per idempotency key
(:func:`wire.keys.state`, formats in :mod:`wire.formats`): ``run:<holder>`` while a
delivery runs it, ``wait:<holder>`` once callers joined it (``wait:`` alone when they
joined before any delivery began), ``done:<outcome>`` once its outcome is stored. So
"nothing runs and nothing is stored" is one ``SET NX``, and the ``SET ... GET`` that
stores the outcome hands back whether anyone joined: only then does the worker run
**deliver**. A call nobody joined never touches its waiters list.

* **claim** (agent): claim the key and push the message; else return the stored
  outcome; else join the execution under way as a waiter. One script for every
  idempotent call of a batch the client sends, in one round trip. A free claim is
  taken without reading the state: a repeat whose claim expired while its outcome is
  still stored is dispatched, and the worker answers it from the store.
* **begin** (worker, when the state was not free): return a stored outcome instead of
  running; else take the state if nobody has begun or it is this process's own; if
  another live delivery holds it, join as a waiter (or, when told the holder is dead,
  take it over, keeping the waiter flag).
* **complete** (worker, when nothing is stored, or a delivery is answered from the
  store): tell the claimant and every waiter; unless an outcome is stored, free the
  claim and drop the key's state if it is this delivery's (or nobody's), so a retry
  runs the call again.
* **deliver** (worker): push a stored outcome to every waiter and drop the list; run
  after a pipelined complete found the waiter flag.
* **release** (both): delete a key only if it still holds a given value (a dead call's
  claim, a dead child's heartbeat record).
* **release holder** (worker): let go of a key's state a dead holder left: dropped,
  or, when callers joined, kept as ``wait:`` with nobody holding it, so the delivery
  that runs it next still tells them.

The scripts that send, put back and fence a call's copies are in :mod:`wire.copies`;
they are :class:`LuaScript` too.

**Loaded and retried one way.** Scripts run by SHA (``EVALSHA``): a run sends the
SHA, not the source. After a Redis restart (or ``SCRIPT FLUSH``) the server has
forgotten them and answers ``NOSCRIPT`` without running anything; the script is then
loaded (``SCRIPT LOAD``) and the run sent once more, on the same connection. No
``SCRIPT EXISTS`` round trip is ever made up front. The worker's redis-py client runs
a script with :meth:`LuaScript.run`, which does this for its one command. The agent's
I/O link (:class:`agent_client._io.link.Link`) sends pipelines of raw commands: each run is
spelled by :meth:`LuaScript.command`, and when entries of a pipeline fail as
``NOSCRIPT`` the link sends :func:`reloading` (a load of every script they ran, then
those entries again) and takes their replies from it. A second ``NOSCRIPT`` is the
caller's to report: the server refused to keep the script.

Waiter entries, reply frames and key states are built here in Lua in the formats of
:mod:`wire.formats` (the state's marks are spliced in from there).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Literal, cast

import redis

from wire.formats import RUNNING_MARK, STORED_MARK, WAITING_MARK
from wire.resp import Arg

__all__ = [
    "BEGIN",
    "CALLER_LOOK",
    "CLAIM",
    "COMPLETE",
    "DELIVER",
    "RELEASE",
    "RELEASE_HOLDER",
    "RENEW",
    "LPUSH_ALL",
    "PUSH_FRAMES",
    "BeginState",
    "LuaScript",
    "is_noscript",
    "pair",
    "pairs",
    "reloading",
]
BeginState = Literal["run", "stored", "busy"]


class LuaScript:
    """One Lua script, run by SHA and loaded again when Redis has forgotten it."""

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()
        _by_sha[self.sha] = self

    def command(self, keys: Sequence[str], args: Sequence[Arg]) -> tuple[Arg, ...]:
        """A run of the script as one raw command, for a pipeline:
        ``EVALSHA sha n keys... args...``."""
        return ("EVALSHA", self.sha, len(keys), *keys, *args)

    def run(self, client: redis.Redis, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        """Run the script on ``client``; load it first if the server does not know it."""
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            self.load(client)
            return client.evalsha(self.sha, len(keys), *keys, *args)

    def load(self, client: redis.Redis) -> None:
        """Load the script into ``client``'s server."""
        client.script_load(self.source)

    def __repr__(self) -> str:
        return f"LuaScript({self.name!r}, sha={self.sha[:8]})"


#: Every script by its SHA, for :func:`reloading`.
_by_sha: dict[str, LuaScript] = {}


def is_noscript(result: object) -> bool:
    """Whether a pipeline entry failed because the server did not know the script."""
    return isinstance(result, redis.exceptions.NoScriptError)


def reloading(commands: Sequence[Sequence[Arg]], forgotten: Sequence[int]) -> list[tuple[Arg, ...]]:
    """The pipeline that follows one whose entries ``forgotten`` failed as ``NOSCRIPT``.

    One ``SCRIPT LOAD`` of each script those entries ran, in order of first use, then
    the entries again, in order: their replies are the last ``len(forgotten)`` ones.
    An entry that is not a run of a known script is sent again as it is.
    """
    loads: dict[str, tuple[Arg, ...]] = {}
    for i in forgotten:
        command = commands[i]
        script = (
            _by_sha.get(str(command[1])) if len(command) > 1 and command[0] == "EVALSHA" else None
        )
        if script is not None and script.sha not in loads:
            loads[script.sha] = ("SCRIPT", "LOAD", script.source)
    return [*loads.values(), *(tuple(commands[i]) for i in forgotten)]


def pair(reply: Any) -> tuple[str, str]:
    """A script's ``{state, value}`` reply as two strings."""
    state, value = (v.decode() if isinstance(v, bytes) else str(v) for v in cast(list[Any], reply))
    return state, value


def pairs(reply: Any) -> list[tuple[str, str]]:
    """A flat ``{state 1, value 1, state 2, value 2, ...}`` reply (:data:`CLAIM`) as pairs."""
    flat = [v.decode() if isinstance(v, bytes) else str(v) for v in cast(list[Any], reply)]
    return list(zip(flat[::2], flat[1::2], strict=True))


# The marks of a key's state (wire.formats) and how to read one. ``holder_of(v)`` is
# the holder in a state that is not stored ('' when nobody has begun).
_STATE = f"""
local RUN, WAIT, DONE = '{RUNNING_MARK}', '{WAITING_MARK}', '{STORED_MARK}'
local function marked(v, mark) return string.sub(v, 1, #mark) == mark end
local function holder_of(v)
  if marked(v, WAIT) then return string.sub(v, #WAIT + 1) end
  if marked(v, RUN) then return string.sub(v, #RUN + 1) end
  return v
end
"""

# Join as a waiter: add ``entry`` to the waiters list and raise the waiter flag in the
# key's state (``v``, its value now, or false), keeping its holder; both live ``ttl``
# ms at least (neither TTL is ever shortened).
_JOIN = (
    _STATE
    + """
local function join(waiters, state, v, ttl, entry)
  redis.call('RPUSH', waiters, entry)
  ttl = tonumber(ttl)
  if redis.call('PTTL', waiters) < ttl then redis.call('PEXPIRE', waiters, ttl) end
  local left = redis.call('PTTL', state)
  if left > ttl then ttl = left end
  redis.call('SET', state, WAIT .. (v and holder_of(v) or ''), 'PX', ttl)
end
"""
)

# Push ``outcome`` to every entry of the Lua table ``waiters``. A waiter entry is
# '<client id> <call id>'; the frame pushed is '<call id>\n<outcome>'.
# (A fragment of wire.handles' end script too.)
PUSH_FRAMES = """
local function push_frames(waiters, outcome, prefix, reply_ttl)
  local pushed = 0
  for _, w in ipairs(waiters) do
    local sep = string.find(w, ' ', 1, true)
    if sep and sep > 1 then
      local rkey = prefix .. string.sub(w, 1, sep - 1)
      redis.call('RPUSH', rkey, string.sub(w, sep + 1) .. '\\n' .. outcome)
      redis.call('EXPIRE', rkey, reply_ttl)
      pushed = pushed + 1
    end
  end
  return pushed
end
"""

# Push the Lua table ``list`` onto ``queue`` in one LPUSH (one per 1,000 messages, a
# bound on unpack's arguments): the list ends as one LPUSH per message would leave it.
# (A fragment of the claim script here and of the push-once script in wire.copies.)
LPUSH_ALL = """
local function lpush_all(queue, list)
  for i = 1, #list, 1000 do
    redis.call('LPUSH', queue, unpack(list, i, math.min(i + 999, #list)))
  end
end
"""

# Messages to push, by queue, in the order the queues came (lpush_all per queue).
_PUSHES = (
    LPUSH_ALL
    + """
local queues, messages = {}, {}
local function push_later(queue, message)
  if not messages[queue] then
    messages[queue] = {}
    queues[#queues + 1] = queue
  end
  table.insert(messages[queue], message)
end
local function push_all()
  for _, queue in ipairs(queues) do lpush_all(queue, messages[queue]) end
end
"""
)

# Any number of calls, in order. Per call, KEYS: claim, state, waiters, queue list;
# ARGV: call id (the claim's value), ttl ms, message, waiter entry, push ('1'/'0').
# Returns {state, value} per call, flat: {state 1, value 1, state 2, value 2, ...}.
CLAIM = LuaScript(
    "claim",
    _JOIN
    + _PUSHES
    + """
local out = {}
for i = 0, #KEYS / 4 - 1 do
  local k, a = 4 * i, 5 * i
  if redis.call('SET', KEYS[k + 1], ARGV[a + 1], 'NX', 'PX', ARGV[a + 2]) then
    if ARGV[a + 5] == '1' then push_later(KEYS[k + 4], ARGV[a + 3]) end
    out[#out + 1] = 'claimed'
    out[#out + 1] = ''
  else
    local v = redis.call('GET', KEYS[k + 2])
    if v and marked(v, DONE) then
      out[#out + 1] = 'stored'
      out[#out + 1] = string.sub(v, #DONE + 1)
    else
      join(KEYS[k + 3], KEYS[k + 2], v, ARGV[a + 2], ARGV[a + 4])
      out[#out + 1] = 'joined'
      out[#out + 1] = ''
    end
  end
end
push_all()
return out
""",
)

# KEYS: state, waiters. ARGV: holder tag, ttl ms, take over ('1'/'0'), waiter entry.
# Run when the begin's SET NX found the state taken; returns {'run', ''},
# {'stored', outcome} or {'busy', holder}.
BEGIN = LuaScript(
    "begin",
    _JOIN
    + """
local v = redis.call('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], RUN .. ARGV[1], 'PX', ARGV[2])
  return {'run', ''}
end
if marked(v, DONE) then return {'stored', string.sub(v, #DONE + 1)} end
local current = holder_of(v)
if current == '' or current == ARGV[1] or ARGV[3] == '1' then
  local ttl = tonumber(ARGV[2])
  if marked(v, WAIT) then
    local left = redis.call('PTTL', KEYS[1])
    if left > ttl then ttl = left end
    redis.call('SET', KEYS[1], WAIT .. ARGV[1], 'PX', ttl)
  else
    redis.call('SET', KEYS[1], RUN .. ARGV[1], 'PX', ttl)
  end
  return {'run', ''}
end
join(KEYS[2], KEYS[1], v, ARGV[2], ARGV[4])
return {'busy', current}
""",
)

# Complete a delivery whose outcome is not stored, or that was answered from the store.
# KEYS: state, waiters, claim, the call's heartbeat record.
# ARGV: outcome JSON, reply ttl s, reply key prefix, the claimant's waiter entry ('' for
#       none), holder tag.
# Returns the number of frames pushed.
COMPLETE = LuaScript(
    "complete",
    _STATE
    + PUSH_FRAMES
    + """
local v = redis.call('GET', KEYS[1])
if not (v and marked(v, DONE)) then
  redis.call('DEL', KEYS[3])
  if v and (v == RUN .. ARGV[5] or v == WAIT .. ARGV[5] or v == WAIT) then
    redis.call('DEL', KEYS[1])
  end
end
local waiters = redis.call('LRANGE', KEYS[2], 0, -1)
if #waiters > 0 then redis.call('DEL', KEYS[2]) end
table.insert(waiters, 1, ARGV[4])
local pushed = push_frames(waiters, ARGV[1], ARGV[3], ARGV[2])
redis.call('DEL', KEYS[4])
return pushed
""",
)

# KEYS: waiters. ARGV: outcome JSON, reply ttl s, reply key prefix.
# Returns the number of frames pushed.
DELIVER = LuaScript(
    "deliver",
    PUSH_FRAMES
    + """
local waiters = redis.call('LRANGE', KEYS[1], 0, -1)
if #waiters == 0 then return 0 end
redis.call('DEL', KEYS[1])
return push_frames(waiters, ARGV[1], ARGV[3], ARGV[2])
""",
)

# KEYS: the key. ARGV: the value it must still hold.
RELEASE = LuaScript(
    "release",
    """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
""",
)

# KEYS: a key's state. ARGV: the holder tag of the delivery that runs it, a TTL in ms.
# Sets the state's TTL again if that delivery still holds it: a write of its own, which a
# WAIT on the same connection then counts (the worker's TOOLEXEC_REPLICA_ACKS).
# Returns 1 if it did, 0 if the state is not that delivery's (gone, taken, stored).
RENEW = LuaScript(
    "renew",
    _STATE
    + """
local v = redis.call('GET', KEYS[1])
if v == RUN .. ARGV[1] or v == WAIT .. ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
""",
)

# KEYS: a key's state. ARGV: the holder tag of a delivery that died.
# Returns 1 if that holder held it (now let go), else 0.
RELEASE_HOLDER = LuaScript(
    "release_holder",
    _STATE
    + """
local v = redis.call('GET', KEYS[1])
if v == RUN .. ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if v == WAIT .. ARGV[1] then
  redis.call('SET', KEYS[1], WAIT, 'KEEPTTL')
  return 1
end
return 0
""",
)

# KEYS: a caller's liveness key (wire.keys.caller), the record of its absence
# (wire.keys.caller_absent). ARGV: the window (ms) the key must stay absent while Redis
# takes these writes, the longest gap (ms) between two looks that still counts as
# "taking writes", how long the absence record lives (ms), how long a "gone" verdict is
# kept in the liveness key (ms).
# Returns 'alive', 'gone' or 'unsure' (absent, but not yet for a whole window of looks).
# Each look is itself a write: while Redis refuses or delays writes (a pause, a restart,
# a full memory) no look lands, the chain of looks breaks at the gap and starts again, so
# an outage can never stand in for a caller's silence.
CALLER_LOOK = LuaScript(
    "caller_look",
    """
local beat = redis.call('GET', KEYS[1])
if beat == 'gone' then return 'gone' end
if beat then
  redis.call('DEL', KEYS[2])
  return 'alive'
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local first, last
local seen = redis.call('GET', KEYS[2])
if seen then
  local comma = string.find(seen, ',', 1, true)
  if comma then
    first, last = tonumber(string.sub(seen, 1, comma - 1)), tonumber(string.sub(seen, comma + 1))
  end
end
if first == nil or last == nil or now < last or now - last > tonumber(ARGV[2]) then
  first = now
end
if now - first >= tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[2])
  redis.call('SET', KEYS[1], 'gone', 'PX', ARGV[4])
  return 'gone'
end
redis.call('SET', KEYS[2], first .. ',' .. now, 'PX', ARGV[3])
return 'unsure'
""",
)
