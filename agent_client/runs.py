"""Runs and what makes two calls "the same call": the run scope, the key, stored outcomes.

``run_scope()`` sets the agent run that idempotent calls are deduplicated within.
Inside a scope, repeats of an idempotent call with the same arguments share one
execution. Outside any scope every call is its own run, so nothing is deduplicated.

The idempotency key hashes the run id, the tool name and the canonical JSON of the
arguments: keys sorted, schema defaults filled in, integral numbers written one way (so
``0`` and ``0.0`` are the same argument). The claim that uses it is
:data:`wire.scripts.CLAIM`, sent by :mod:`agent_client._io.redis_lane`.

A stored outcome never changes while it is kept, so a repeat of the call in the same
process is answered from this process's memory of it (:class:`StoredOutcomes`), with no
round trip at all. Bounded (least recently used first out) and kept no longer than
``TOOLEXEC_OUTCOME_TTL``.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
import uuid
from collections import OrderedDict
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Any

from wire.models import MAX_KEY_LENGTH, CallOutcome

__all__ = [
    # The run
    "run_scope",
    "current_run_id",
    "check_key",
    # The key
    "idempotency_key",
    "canonical_arguments",
    # Stored outcomes
    "StoredOutcomes",
]

_run_id: ContextVar[str | None] = ContextVar("toolexec_run_id", default=None)


def check_key(value: object, *, what: str) -> str | None:
    """Return ``value`` if it is None or a run id or idempotency key the wire carries (a
    string of 1 to :data:`~wire.models.MAX_KEY_LENGTH` characters); else raise
    ``ValueError`` naming ``what``."""
    if value is None or (isinstance(value, str) and 0 < len(value) <= MAX_KEY_LENGTH):
        return value
    shown = (
        f"a string of {len(value)} characters" if isinstance(value, str) and value else repr(value)
    )
    raise ValueError(
        f"{what} must be a non-empty string of at most {MAX_KEY_LENGTH} characters, got {shown}"
    )


def current_run_id() -> str | None:
    """The run id of the innermost :class:`run_scope`, or None outside any."""
    return _run_id.get()


class run_scope:
    """Set the run id for the calls made inside; usable with ``with`` and ``async with``.

    Args:
        run_id: The run's id, e.g. your framework's; a fresh one when omitted.

    Example:
        with run_scope() as run_id:
            book(flight_id="BA117", passenger="Ada")  # runs
            book(flight_id="BA117", passenger="Ada")  # same run, same arguments: joined
    """

    def __init__(self, run_id: str | None = None) -> None:
        check_key(run_id, what="run_id")
        self.run_id = run_id or uuid.uuid4().hex
        self._tokens: list[Token[str | None]] = []

    def __enter__(self) -> str:
        self._tokens.append(_run_id.set(self.run_id))
        return self.run_id

    def __exit__(self, *exc: object) -> None:
        _run_id.reset(self._tokens.pop())

    async def __aenter__(self) -> str:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__()


# -- the idempotency key ----------------------------------------------------------------


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


def idempotency_key(
    run_id: str, tool: str, schema: dict[str, Any], arguments: dict[str, Any]
) -> str:
    """The key of a call: SHA-256 over run id, tool and canonical arguments."""
    canonical = json.dumps(
        [run_id, tool, canonical_arguments(schema, arguments)],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


# -- outcomes this process has seen stored -----------------------------------------------


class StoredOutcomes:
    """A bounded, expiring map: idempotency key -> stored outcome."""

    def __init__(self, *, ttl: float, max_entries: int = 10_000) -> None:
        self._ttl = ttl
        self._max = max_entries
        self._entries: OrderedDict[str, tuple[float, CallOutcome]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> CallOutcome | None:
        """The outcome stored under ``key``, if this process saw it and it is still kept."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry[0] <= time.monotonic():
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return entry[1]

    def put(self, key: str, outcome: CallOutcome) -> None:
        """Remember ``outcome`` as stored under ``key``."""
        with self._lock:
            self._entries[key] = (time.monotonic() + self._ttl, outcome)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)

    def after_fork(self) -> None:
        """In a forked child: a fresh lock (another thread of the parent may have held it)."""
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)
