"""Whether a call's caller still waits: queued work nobody waits for never starts.

A client process keeps a key of its own alive while it runs (:func:`wire.keys.caller`:
one heartbeat interval long, refreshed three times an interval, by the client's I/O
thread) and says so in each call it sends (``CallRequest.caller_beats``). A worker about
to start such a call asks whether that key is still there (:func:`caller_waits`). Gone,
the caller died (or closed its client): the call is shed unrun, as one whose deadline
passed is (``ErrorKind.EXPIRED``, type ``CallerGone``), and an idempotent call's claim is
freed so that any caller that joined it runs it afresh.

One look per caller serves this process for a third of an interval (a worker starting
many calls of one agent asks once), so a caller's queued calls are shed within about an
interval and a third of its death. A caller found alive is asked again after that; a
Redis that cannot be asked counts as "alive": the call runs, as it would have before.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from wire import keys
from wire.models import CallOutcome, CallRequest, ErrorKind
from wire.settings import Settings

__all__ = ["caller_known_waiting", "caller_waits", "shed"]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
#: client id -> until when (``time.monotonic()``) it is known to wait.
_waiting: dict[str, float] = {}
#: Callers remembered at most (the oldest looks are dropped first).
_MAX_REMEMBERED = 10_000


def caller_known_waiting(call: CallRequest) -> bool:
    """Whether ``call``'s caller is known, without asking Redis, to wait for it (or does
    not beat at all, so cannot be asked)."""
    if not call.caller_beats or not call.reply_to:
        return True
    return _waiting.get(call.reply_to, 0.0) > time.monotonic()


def caller_waits(client: redis.Redis, call: CallRequest, *, settings: Settings) -> bool:
    """Whether ``call``'s caller still waits for it (asks Redis at most once a third of an
    interval per caller)."""
    if caller_known_waiting(call):
        return True
    try:
        alive = bool(client.exists(keys.caller(call.reply_to)))
    except redis.RedisError as exc:
        logger.debug("could not ask whether the caller of %s waits: %s", call.call_id, type(exc).__name__)
        return True
    if alive:
        with _lock:
            if len(_waiting) >= _MAX_REMEMBERED:
                _waiting.clear()
            _waiting[call.reply_to] = time.monotonic() + settings.heartbeat_interval / 3
    return alive


def shed(call: CallRequest, *, worker: str) -> CallOutcome:
    """The outcome of a call shed unrun because its caller no longer waits."""
    logger.info("call %s of %s: its caller no longer waits; not running it", call.call_id, call.tool)
    return CallOutcome.failure(
        call.call_id, ErrorKind.EXPIRED, "CallerGone",
        f"the caller of this call to {call.tool!r} stopped waiting (its client process is gone) "
        "before a worker started it; it was not run",
        worker=worker,
    )  # fmt: skip
