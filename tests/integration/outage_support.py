"""What the Redis outage tests share besides their fixtures (``own_server``, ``own_env``,
``own_client``, ``own_store`` in ``conftest.py``): freezing the server, reading its
command counts.

Faults are real: the server process is stopped with ``SIGSTOP`` (frozen: connections
stay open, nothing is answered) or killed with ``SIGKILL`` and started again on the
same port and directory.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import redis

from agent_client import RemoteToolError
from toolexec import RedisServer

__all__ = ["SLACK", "echo_works", "freeze", "frozen", "thaw", "what_redis_holds_of"]

#: How late past its deadline a caller may hear.
SLACK = 0.05


def freeze(server: RedisServer) -> None:
    """Stop the server process (``SIGSTOP``, by its PID)."""
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)


def thaw(server: RedisServer) -> None:
    """Let a frozen server run again (``SIGCONT``)."""
    if server.pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server.pid, signal.SIGCONT)


@contextlib.contextmanager
def frozen(server: RedisServer) -> Iterator[None]:
    """Redis stopped (``SIGSTOP``) for the block: it answers nothing, closes nothing."""
    freeze(server)
    try:
        yield
    finally:
        thaw(server)


def echo_works(echo: object) -> bool:
    """Whether a call of the ``probe_echo`` proxy ``echo`` gets its result now."""
    try:
        return bool(echo(text="awake", number=1)["text"] == "awake")  # type: ignore[operator]
    except RemoteToolError:
        return False


def what_redis_holds_of(store: redis.Redis, call_ids: list[str], *logs: str) -> str:
    """For a failure message: every key that names each call (its type, TTL and value),
    each list entry that names it, and each line of ``logs`` (the workers' and the
    client's) that does."""
    if not call_ids:
        return ""
    lines: list[str] = []
    lists = [key for key in store.scan_iter(count=1000) if store.type(key) == b"list"]
    for call_id in call_ids[:5]:
        lines.append(f"call {call_id}:")
        for key in store.scan_iter(match=f"*{call_id}*", count=1000):
            kind = store.type(key).decode()
            value = (
                store.get(key)
                if kind == "string"
                else store.hgetall(key)
                if kind == "hash"
                else kind
            )
            lines.append(f"  key {key!r} ttl {store.pttl(key)} ms: {value!r}"[:400])
        for key in lists:
            entries = [e for e in store.lrange(key, 0, -1) if call_id.encode() in e]
            lines += [f"  in list {key!r}: {e[:300]!r}" for e in entries]
        lines += [
            f"  log: {line[:300]}" for log in logs for line in log.splitlines() if call_id in line
        ]
    return "\n".join(lines)
