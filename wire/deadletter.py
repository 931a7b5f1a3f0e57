"""The dead-letter list's entries and the commands that record one: both sides write it.

A worker dead-letters what it refuses (:mod:`executor.seams.deadletter`); a client's watchdog
dead-letters an at-least-once call it gives up after its workers died on every delivery
(:mod:`agent_client._io.watchdog`). Each entry is one JSON object pushed onto
:data:`wire.keys.DEADLETTER` (newest first, capped at ``DEADLETTER_MAX_ENTRIES``, TTL
``DEADLETTER_TTL`` refreshed each time), and its reason is counted in the hash
:data:`wire.keys.DEADLETTER_COUNT`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from typing import Any

from wire import keys
from wire.keys import DEADLETTER_MAX_ENTRIES, DEADLETTER_PAYLOAD_BYTES, DEADLETTER_TTL

__all__ = ["deadletter_commands", "deadletter_entry"]


def deadletter_entry(
    reason: str,
    *,
    queue: str,
    payload: bytes | str | None,
    detail: str = "",
    call_id: str | None = None,
) -> dict[str, Any]:
    """One entry: ``reason``, ``queue``, ``time``, ``sha256`` and ``size`` of the payload,
    ``detail``, ``call_id``, and the payload itself, base64-encoded and cut at
    ``DEADLETTER_PAYLOAD_BYTES`` (``payload_truncated`` says so)."""
    raw = payload.encode("utf-8", "surrogateescape") if isinstance(payload, str) else payload or b""
    return {
        "reason": reason,
        "queue": queue,
        "time": time.time(),
        "sha256": hashlib.sha256(raw).hexdigest(),
        "size": len(raw),
        "detail": detail,
        "call_id": call_id,
        "payload_b64": base64.b64encode(raw[:DEADLETTER_PAYLOAD_BYTES]).decode(),
        "payload_truncated": len(raw) > DEADLETTER_PAYLOAD_BYTES,
    }


def deadletter_commands(entry: dict[str, Any]) -> list[tuple[str | int, ...]]:
    """The Redis commands that record ``entry`` and count its reason, in order."""
    return [
        ("LPUSH", keys.DEADLETTER, json.dumps(entry, separators=(",", ":"))),
        ("LTRIM", keys.DEADLETTER, 0, DEADLETTER_MAX_ENTRIES - 1),
        ("EXPIRE", keys.DEADLETTER, DEADLETTER_TTL),
        ("HINCRBY", keys.DEADLETTER_COUNT, entry["reason"], 1),
        ("EXPIRE", keys.DEADLETTER_COUNT, DEADLETTER_TTL),
    ]
