"""The client's half of "nothing runs twice": the idempotency key and the claim.

The key hashes the run id, the tool name and the canonical JSON of the arguments:
keys sorted, schema defaults filled in, integral numbers written one way (so ``0``
and ``0.0`` are the same argument). The claim is one Lua script, one round trip:
return a stored outcome, or claim the key and push the message, or join the
execution under way as a waiter.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Literal, cast

import redis

from executor import keys

__all__ = [
    "CLAIM_SHA",
    "Claim",
    "canonical_arguments",
    "claim_call",
    "idempotency_key",
    "load_claim_script",
    "parse_claim",
    "release_claim",
]

Claim = Literal["claimed", "stored", "joined"]

_CLAIM = """
local stored = redis.call('GET', KEYS[2])
if stored then return {'stored', stored} end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if ARGV[5] == '1' then redis.call('LPUSH', KEYS[4], ARGV[3]) end
  return {'claimed', ''}
end
redis.call('RPUSH', KEYS[3], ARGV[4])
if redis.call('PTTL', KEYS[3]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[3], ARGV[2]) end
return {'joined', ''}
"""

CLAIM_SHA = hashlib.sha1(_CLAIM.encode()).hexdigest()


def canonical_arguments(schema: dict[str, Any], arguments: dict[str, Any]) -> Any:
    """``arguments`` with the schema's defaults filled in and numbers made canonical."""
    return _canonical(schema, arguments, schema.get("$defs", {}))


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return defs.get(ref.removeprefix("#/$defs/"), {})  # type: ignore[no-any-return]
    return schema


def _branch(schema: dict[str, Any], value: Any, defs: dict[str, Any]) -> dict[str, Any]:
    # ``Seat | None`` is ``anyOf: [{$ref: Seat}, {type: null}]``: an object value takes
    # the branch that describes objects, so its defaults are filled in like any other.
    for combinator in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(combinator)
        if not isinstance(branches, list):
            continue
        for branch in branches:
            resolved = _resolve(branch, defs) if isinstance(branch, dict) else {}
            kind = resolved.get("type")
            if isinstance(value, dict) and ("properties" in resolved or kind == "object"):
                return resolved
            if isinstance(value, list) and ("items" in resolved or kind == "array"):
                return resolved
    return schema


def _canonical(schema: dict[str, Any], value: Any, defs: dict[str, Any]) -> Any:
    schema = _branch(_resolve(schema, defs), value, defs)
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        out = {k: _canonical(properties.get(k, {}), v, defs) for k, v in value.items()}
        for name, prop in properties.items():
            if name not in out and "default" in prop:
                out[name] = _canonical(prop, prop["default"], defs)
        return out
    if isinstance(value, list):
        items = schema.get("items", {})
        return [_canonical(items if isinstance(items, dict) else {}, v, defs) for v in value]
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def idempotency_key(run_id: str, tool: str, schema: dict[str, Any], arguments: dict[str, Any]) -> str:
    """The key of a call: SHA-256 over run id, tool and canonical arguments."""
    canonical = json.dumps(
        [run_id, tool, canonical_arguments(schema, arguments)],
        sort_keys=True, separators=(",", ":"), ensure_ascii=False,
    )  # fmt: skip
    return hashlib.sha256(canonical.encode()).hexdigest()


def claim_call(
    pipe: redis.client.Pipeline,
    key: str,
    *,
    call_id: str,
    reply_to: str,
    ttl_ms: int,
    queue: str,
    envelope: str,
    push: bool,
) -> None:
    """Queue the claim of ``key`` on ``pipe``: claim it (and push ``envelope`` when
    ``push``), or find its stored outcome, or join the execution under way.

    Read the pipeline's result with :func:`parse_claim`.
    """
    # EVALSHA without redis-py's per-pipeline SCRIPT EXISTS round trip: a NOSCRIPT
    # reply (after a Redis restart) is answered with load_claim_script() and a resend.
    pipe.evalsha(
        CLAIM_SHA, 4, keys.claim(key), keys.outcome(key), keys.waiters(key), queue,
        call_id, ttl_ms, envelope, f"{reply_to} {call_id}", "1" if push else "0",
    )  # fmt: skip


_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def release_claim(client: redis.Redis, key: str, *, call_id: str) -> bool:
    """Free ``key``'s claim if ``call_id`` still holds it (its worker died unfinished)."""
    return bool(client.eval(_RELEASE, 1, keys.claim(key), call_id))


def load_claim_script(client: redis.Redis) -> None:
    """Load the claim script into ``client``'s server (after NOSCRIPT)."""
    client.script_load(_CLAIM)


def parse_claim(result: Any) -> tuple[Claim, str]:
    """``("claimed", "")``, ``("stored", outcome JSON)`` or ``("joined", "")``."""
    state, value = (v.decode() if isinstance(v, bytes) else v for v in result)
    return cast(Claim, state), value
