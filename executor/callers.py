"""Whether a call's caller still waits: queued work nobody waits for never starts.

A client process keeps a key of its own alive while it runs (:func:`wire.keys.caller`:
one heartbeat interval long, refreshed three times an interval, by the client's I/O
thread) and says so in each call it sends (``CallRequest.caller_beats``). A worker about
to start such a call asks whether its caller still waits (:func:`caller_waits`).

**An outage is not a death.** The key lapses whenever Redis cannot take the client's
refresh (a pause longer than an interval, a full memory) and vanishes with a restart, so
its absence alone proves nothing. A caller is judged gone only on evidence gathered while
Redis took writes: its key absent across a whole interval of looks (each look a write,
:data:`wire.scripts.CALLER_LOOK`, a third of an interval apart, none more than half an
interval after the one before, on Redis' own clock). A live client rewrites its key
within a third of an interval of Redis taking writes again, so a stall or a restart
never sheds its calls; while the verdict is out, the call waits (not past its deadline).
A client that closes says ``gone`` in its key: its calls still queued are shed at once.

**Bounds.** A call of a dead caller never starts later than an interval and a third after
its death (the key lapses within an interval; a caller found alive is not asked again for
a third of one). Its shed outcome is written within about two intervals and a half of
the death (an interval more of looks). A Redis that cannot be asked for longer than two
intervals lets the call run, as a call ran before this check existed.

A call shed is answered like one whose deadline passed (``ErrorKind.EXPIRED``, type
``CallerGone``), and an idempotent call's claim is freed so that any caller that joined
it runs it afresh.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
import time
from collections.abc import Awaitable, Callable

import redis

from wire import keys
from wire.clock import shared_now
from wire.models import CallOutcome, CallRequest, ErrorKind
from wire.scripts import CALLER_LOOK
from wire.settings import Settings

__all__ = ["Verdict", "caller_known_waiting", "caller_waits", "caller_waits_async", "look", "shed"]

logger = logging.getLogger(__name__)


class Verdict(enum.Enum):
    """What one look at a caller found."""

    ALIVE = "alive"
    GONE = "gone"
    #: Its key is absent, but not yet across a whole interval of looks Redis took; or
    #: Redis could not be asked.
    UNSURE = "unsure"


_lock = threading.Lock()
#: client id -> until when (``time.monotonic()``) it is known to wait.
_waiting: dict[str, float] = {}
#: client id -> until when (``time.monotonic()``) it is known to be gone. Not for good: a
#: client that closed may be used again (its calls then start its thread, and its key,
#: again), so a verdict lasts a third of an interval here, and its key says it meanwhile.
_gone: dict[str, float] = {}
#: Callers remembered at most, each way (the memory is cleared past it).
_MAX_REMEMBERED = 10_000
#: How long a worker keeps asking a Redis it cannot reach before it lets the call run,
#: in heartbeat intervals.
_UNREACHABLE_BEATS = 2.0


def caller_known_waiting(call: CallRequest) -> bool:
    """Whether ``call``'s caller is known, without asking Redis, to wait for it (or does
    not beat at all, so cannot be asked)."""
    if not call.caller_beats or not call.reply_to:
        return True
    return _waiting.get(call.reply_to, 0.0) > time.monotonic()


def look(client: redis.Redis, call: CallRequest, *, settings: Settings) -> Verdict:
    """One look at ``call``'s caller (one script run; :data:`Verdict.UNSURE` when Redis
    cannot be asked). Remembers an answer that is one."""
    interval_ms = int(settings.heartbeat_interval * 1000)
    try:
        found = CALLER_LOOK.run(
            client,
            [keys.caller(call.reply_to), keys.caller_absent(call.reply_to)],
            [interval_ms, interval_ms // 2, interval_ms * 3, interval_ms * keys.CALLER_GONE_BEATS],
        )
    except redis.RedisError as exc:
        logger.debug(
            "could not ask whether the caller of %s waits: %s", call.call_id, type(exc).__name__
        )
        return Verdict.UNSURE
    verdict = Verdict(found.decode() if isinstance(found, bytes) else str(found))
    with _lock:
        if verdict is Verdict.ALIVE:
            if len(_waiting) >= _MAX_REMEMBERED:
                _waiting.clear()
            _waiting[call.reply_to] = time.monotonic() + settings.heartbeat_interval / 3
        elif verdict is Verdict.GONE:
            if len(_gone) >= _MAX_REMEMBERED:
                _gone.clear()
            _gone[call.reply_to] = time.monotonic() + settings.heartbeat_interval / 3
    return verdict


def _settled(
    call: CallRequest, verdict: Verdict | None, *, unsure_since: float, settings: Settings
) -> bool | float:
    """True or False once the caller is known to wait or not; else how long to pause
    before the next look. Gives the call the benefit of the doubt (True) once its
    deadline passed (the caller's deadline check refuses it then) and once Redis has been
    out of reach for :data:`_UNREACHABLE_BEATS` intervals."""
    if verdict is None:
        if _gone.get(call.reply_to, 0.0) > time.monotonic():
            return False
        return True if caller_known_waiting(call) else 0.0
    if verdict is not Verdict.UNSURE:
        return verdict is Verdict.ALIVE
    if call.deadline is not None and shared_now() >= call.deadline:
        return True
    if time.monotonic() - unsure_since >= settings.heartbeat_interval * _UNREACHABLE_BEATS:
        logger.warning(
            "call %s of %s: could not tell for %gs whether its caller waits; running it",
            call.call_id,
            call.tool,
            settings.heartbeat_interval * _UNREACHABLE_BEATS,
        )
        return True
    pause = settings.heartbeat_interval / 3
    if call.deadline is not None:
        pause = min(pause, max(call.deadline - shared_now(), 0.0))
    return pause


def caller_waits(client: redis.Redis, call: CallRequest, *, settings: Settings) -> bool:
    """Whether ``call``'s caller still waits for it. Asks Redis at most once a third of an
    interval per caller while it is found alive; while the verdict is out (its key absent,
    not yet for a whole interval of writes), waits and looks again."""
    since = time.monotonic()
    step = _settled(call, None, unsure_since=since, settings=settings)
    while not isinstance(step, bool):
        if step:
            time.sleep(step)
        step = _settled(
            call, look(client, call, settings=settings), unsure_since=since, settings=settings
        )
    return step


async def caller_waits_async(
    look_off_loop: Callable[[], Awaitable[Verdict]], call: CallRequest, *, settings: Settings
) -> bool:
    """:func:`caller_waits` on an event loop: each look runs through ``look_off_loop``
    (an I/O thread), the pauses are the loop's own."""
    since = time.monotonic()
    step = _settled(call, None, unsure_since=since, settings=settings)
    while not isinstance(step, bool):
        if step:
            await asyncio.sleep(step)
        step = _settled(call, await look_off_loop(), unsure_since=since, settings=settings)
    return step


def shed(call: CallRequest, *, worker: str, settings: Settings) -> CallOutcome:
    """The outcome of a call shed unrun because its caller no longer waits."""
    logger.info(
        "call %s of %s: its caller no longer waits; not running it", call.call_id, call.tool
    )
    return CallOutcome.failure(
        call.call_id,
        ErrorKind.EXPIRED,
        "CallerGone",
        f"a worker did not run this call to {call.tool!r}: its caller's liveness key said it "
        f"closed, or stayed absent for {settings.heartbeat_interval:g}s while Redis took writes, "
        "so the caller was judged gone (a client that cannot reach Redis for that long is taken "
        "for dead)",
        worker=worker,
    )
