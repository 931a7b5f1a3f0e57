"""Every Redis key toolexec writes, in one place.

Everything but the catalog (``CATALOG`` and ``WORKERS``) is written with a TTL.
"""

from __future__ import annotations

__all__ = [
    "CATALOG",
    "PREFIX",
    "WORKERS",
    "claim",
    "outcome",
    "reply",
    "running",
    "waiters",
    "worker",
]

PREFIX = "toolexec:"

#: Hash: tool name -> ToolSpec JSON. No TTL: it is the catalog.
CATALOG = PREFIX + "catalog"
#: Set of worker ids that have published a heartbeat. No TTL: pruned by readers.
WORKERS = PREFIX + "workers"


def worker(worker_id: str) -> str:
    """Heartbeat of one worker (TTL: the heartbeat interval)."""
    return f"{PREFIX}worker:{worker_id}"


def reply(client_id: str) -> str:
    """List of outcomes waiting for one client process (TTL: reply_ttl)."""
    return f"{PREFIX}reply:{client_id}"


def claim(idempotency_key: str) -> str:
    """Who claimed an idempotent call (TTL: deadline + hard limit + margin)."""
    return f"{PREFIX}claim:{idempotency_key}"


def outcome(idempotency_key: str) -> str:
    """The stored outcome of an idempotent call (TTL: outcome_ttl)."""
    return f"{PREFIX}outcome:{idempotency_key}"


def waiters(idempotency_key: str) -> str:
    """Reply addresses of callers that joined an idempotent call (TTL: as its claim)."""
    return f"{PREFIX}waiters:{idempotency_key}"


def running(idempotency_key: str) -> str:
    """The delivery currently executing an idempotent call (TTL: hard limit + margin)."""
    return f"{PREFIX}running:{idempotency_key}"
