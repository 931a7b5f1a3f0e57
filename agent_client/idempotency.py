"""The idempotency key of a call: what makes two calls "the same call".

The key hashes the run id, the tool name and the canonical JSON of the arguments:
keys sorted, schema defaults filled in, integral numbers written one way (so ``0``
and ``0.0`` are the same argument). The claim that uses it is
:data:`wire.scripts.CLAIM`, sent by :mod:`agent_client.send`.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

__all__ = ["canonical_arguments", "idempotency_key"]



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
