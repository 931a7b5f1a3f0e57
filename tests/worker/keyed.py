"""Helpers of the tests of an idempotency key's records: its keys, and the scripts' runs."""

from __future__ import annotations

from collections import Counter

import redis

from tests.redis_stats import commands
from wire import keys
from wire.formats import KeyState, parse_state, waiter_entry
from wire.scripts import CLAIM, pair

from .support import unique

__all__ = ["HOLDER", "OTHER", "TTL_MS", "Idempotent", "claim", "commands", "sent", "state_of"]

TTL_MS = 60_000
HOLDER = "w1@host:100|101"
OTHER = "w2@host:200|201"


class Idempotent:
    """The keys of one idempotency key, fresh per test."""

    def __init__(self) -> None:
        self.key = unique("key")
        self.claim = keys.claim(self.key)
        self.state = keys.state(self.key)
        self.waiters = keys.waiters(self.key)
        self.queue = unique("queue")


def claim(
    client: redis.Redis,
    idem: Idempotent,
    call_id: str,
    *,
    push: bool = True,
    ttl_ms: int = TTL_MS,
    reply_to: str = "client-1",
) -> tuple[str, str]:
    """One call's run of the claim script: (state, value)."""
    return pair(
        CLAIM.run(
            client,
            [idem.claim, idem.state, idem.waiters, idem.queue],
            [
                call_id,
                ttl_ms,
                f"message of {call_id}",
                waiter_entry(reply_to, call_id),
                "1" if push else "0",
            ],
        )
    )


def state_of(client: redis.Redis, idem: Idempotent) -> KeyState:
    """What the key's state says now."""
    return parse_state(client.get(idem.state))


def sent(client: redis.Redis, before: Counter[str]) -> dict[str, int]:
    """Commands run since ``before`` (a reading of :func:`tests.redis_stats.commands`)."""
    return dict(commands(client) - before)
