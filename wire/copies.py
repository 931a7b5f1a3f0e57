"""The copies of one call on their way to a worker: sent once, sent again, put back, fenced.

A call's message may be in more than one place over its life: the client pushes it once
(**push once**: a re-send after an unknown outcome cannot queue it twice); a worker whose
connection breaks or that shuts down puts back the calls it had taken but not started
(**put back**); the client's watchdog sends again a call whose worker died
(**resend**: the fence first, then the copy, pushed once). Each copy sent again carries
kombu's ``redelivered`` flag and its *generation* in front of the original envelope
(:func:`sent_again`: the client's first resend is generation 1, a worker's put-back
keeps the copy's own, 0 for the original), one spelling built the same way by both
sides, so that the watchdog finds any copy in a queue's list by its exact text
(``LPOS``).

Which copy may start is the call's **fence** (:func:`wire.keys.fence`): absent, any
copy; a number, only the copy of that generation (or a later one); ``x``, none, as the
client gave the call up (``WorkerLost``, ``ToolOutcomeUnknown``). A copy sent again asks
before it starts (**start**), in one step with the record naming its holder, so no copy
the client gave up on or sent again since can run, and the watchdog, which gives up
(**give up**) or sends again (**resend**) only if no holder has been recorded since it
looked, never does so for a copy that has just started. A first send never asks: no
copy of it exists that the client could have given up on while it was queued.
"""

from __future__ import annotations

from wire.scripts import LPUSH_ALL, LuaScript

__all__ = [
    "FENCED",
    "GIVE_UP",
    "LET_GO",
    "PUSH_ONCE",
    "PUT_BACK",
    "RESEND",
    "START",
    "generation_of",
    "sent_again",
]

#: The fence's value once the client gave the call up: no copy may start.
FENCED = "x"

#: What a copy sent again starts with, before its generation and the original's fields.
_AGAIN = '{"redelivered":true,"toolexec_generation":'


def sent_again(envelope: str | bytes, generation: int) -> str:
    """The envelope of a copy of ``envelope`` sent again, as generation ``generation``.

    The original's text follows the flag and the generation as it was, so the copy's
    text is known from the original's alone; a copy of a copy replaces the generation.
    """
    text = envelope.decode() if isinstance(envelope, bytes) else envelope
    if text.startswith(_AGAIN):
        text = "{" + text[text.index(",", len(_AGAIN)) + 1 :]
    return f"{_AGAIN}{int(generation)},{text[1:]}"


def generation_of(envelope: str | bytes) -> int | None:
    """The generation of a copy sent again (:func:`sent_again`); None for a first send."""
    text = envelope.decode(errors="replace") if isinstance(envelope, bytes) else envelope
    if not text.startswith(_AGAIN):
        return None
    digits = text[len(_AGAIN) : text.find(",", len(_AGAIN))]
    return int(digits) if digits.isdigit() else None


# KEYS: the queue's list, then one sent marker per call.
# ARGV: per call, its marker's TTL in ms and its message.
# Returns, per call, 1 if it pushed the message, 0 if the call had been pushed before.
# The messages pushed go in one LPUSH.
PUSH_ONCE = LuaScript(
    "push_once",
    LPUSH_ALL
    + """
local pushed, messages = {}, {}
for i = 2, #KEYS do
  if redis.call('SET', KEYS[i], '1', 'NX', 'PX', ARGV[2 * i - 3]) then
    messages[#messages + 1] = ARGV[2 * i - 2]
    pushed[i - 1] = 1
  else
    pushed[i - 1] = 0
  end
end
lpush_all(KEYS[1], messages)
return pushed
""",
)

# KEYS: the queue's list, the put-back's marker (``restored:...``), the call's holder
# record (``running:<call id>``), the call's fence. ARGV: the marker's TTL in ms, the
# message, and the holder tags' prefix of the worker putting it back (``<worker id>|``;
# "" for none).
# Returns 1 if it put the message back, 0 if it had been put back before or the client
# gave the call up (its fence is ``x``: the copy would never start).
# The message goes to the end its queue is read from (RPUSH: the next one taken, as it
# was when the worker took it), and the record naming this worker as its holder goes,
# so that a waiting client sees the call queued, not held by a worker that is leaving.
PUT_BACK = LuaScript(
    "put_back",
    f"""
if redis.call('GET', KEYS[4]) == '{FENCED}' then return 0 end
if not redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[1]) then return 0 end
redis.call('RPUSH', KEYS[1], ARGV[2])
if ARGV[3] ~= '' then
  local held = redis.call('GET', KEYS[3])
  if held and string.sub(held, 1, #ARGV[3]) == ARGV[3] then redis.call('DEL', KEYS[3]) end
end
return 1
""",
)

# KEYS: the call's fence, its holder record. ARGV: the copy's generation, its holder
# tag, the record's TTL in ms.
# Returns 'run' (and records the holder), 'fenced' (the client gave the call up) or
# 'stale' (the client has sent a later copy).
START = LuaScript(
    "start",
    f"""
local fence = redis.call('GET', KEYS[1])
if fence == '{FENCED}' then return 'fenced' end
if fence and tonumber(fence) and tonumber(fence) > tonumber(ARGV[1]) then return 'stale' end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
return 'run'
""",
)

# KEYS: the call's fence, its holder record. ARGV: the generation of the copy about to be
# sent, the fence's TTL in ms, the holder record as the watchdog last read it ('' for
# none).
# Returns 1 if that copy may be sent (the fence now names its generation: earlier copies
# are stale); 0 if the call was given up, a later copy was sent, or a holder has been
# recorded since the watchdog looked (the call is not lost). The copy itself is then
# pushed once (PUSH_ONCE under its own sent marker), on the broker, which may be
# another server.
RESEND = LuaScript(
    "resend",
    f"""
local fence = redis.call('GET', KEYS[1])
if fence == '{FENCED}' or (fence and tonumber(fence) and tonumber(fence) > tonumber(ARGV[1])) then
  return 0
end
local held = redis.call('GET', KEYS[2])
if held and held ~= ARGV[3] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
""",
)

# KEYS: the call's fence, its holder record. ARGV: the fence's TTL in ms, the holder
# record as the watchdog last read it ('' for none).
# Returns 1 if the call is given up (no copy of it may start from now on), 0 if a
# holder has been recorded since the watchdog looked (it is not lost).
GIVE_UP = LuaScript(
    "give_up",
    f"""
local held = redis.call('GET', KEYS[2])
if held and held ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[1], '{FENCED}', 'PX', ARGV[1])
return 1
""",
)

# KEYS: a call's holder record. ARGV: the holder tags' prefix of a worker (``<worker id>|``).
# Returns 1 if the record named that worker (and is gone now), else 0.
LET_GO = LuaScript(
    "let_go",
    """
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, #ARGV[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
""",
)
