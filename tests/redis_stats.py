"""What a Redis server has run, from ``INFO commandstats``: the one reading every test uses.

Redis counts a command a Lua script runs as well as the script's own call, so a script
that pushes counts as an ``EVALSHA`` and an ``LPUSH``. The ``INFO`` readings themselves
are left out.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import redis

__all__ = ["calls_of", "commands"]


def commands(client: redis.Redis) -> Counter[str]:
    """Commands the server has run so far, by lower-case name (``info`` left out)."""
    stats: dict[str, Any] = client.info("commandstats")
    counts = Counter({name.removeprefix("cmdstat_"): int(s["calls"]) for name, s in stats.items()})
    counts.pop("info", None)
    return counts


def calls_of(client: redis.Redis, command: str) -> int:
    """How many times the server has run ``command`` (lower case; also inside scripts)."""
    return commands(client)[command]
