"""The tools ``python -m bench chaos`` loads into its workers: each records its runs.

Every tool appends ``start <token> <pid> <time>`` as its body begins and ``end <token>
<pid> <time>`` as it returns to the side-effect log (``$TOOLEXEC_DATA_DIR/chaos-effects``,
one ``O_APPEND`` write per line, so lines from many processes never interleave); the
checker (:mod:`bench.chaos`) reads it beside every caller's outcomes. One tool per
delivery mode: at most once (plain), at least once, idempotent (at least once, keyed).
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

from executor import tool
from wire.settings import Settings

__all__ = ["QUEUE", "TOOLS", "chaos_alo", "chaos_idem", "chaos_plain", "effects_path"]

#: The queue every chaos tool is served on.
QUEUE = "chaos"
#: The tools by delivery mode.
TOOLS = ("chaos_plain", "chaos_alo", "chaos_idem")


def effects_path(data_dir: str | Path) -> Path:
    """Where the side-effect log of a chaos run is."""
    return Path(data_dir) / "chaos-effects"


@functools.cache
def _log() -> int:
    path = effects_path(Settings.from_env().data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def _note(what: str, token: str) -> None:
    os.write(_log(), f"{what} {token} {os.getpid()} {time.time():.4f}\n".encode())


def _work(token: str, seconds: float) -> str:
    _note("start", token)
    time.sleep(seconds)
    _note("end", token)
    return token


@tool(queue=QUEUE)
def chaos_plain(token: str, seconds: float) -> str:
    """At most once: record a start, work ``seconds``, record an end.

    Args:
        token: Names this call in the side-effect log.
        seconds: How long the work takes.
    """
    return _work(token, seconds)


@tool(queue=QUEUE, delivery="at_least_once")
def chaos_alo(token: str, seconds: float) -> str:
    """At least once: record a start, work ``seconds``, record an end.

    Args:
        token: Names this call in the side-effect log.
        seconds: How long the work takes.
    """
    return _work(token, seconds)


@tool(queue=QUEUE, idempotent=True)
def chaos_idem(token: str, seconds: float) -> str:
    """Idempotent (at least once, keyed by its run and arguments): as the others.

    Args:
        token: Names this call in the side-effect log.
        seconds: How long the work takes.
    """
    return _work(token, seconds)
