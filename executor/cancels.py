"""Cancel, on the worker: hear a cancel, refuse a cancelled call, stop a running one.

A cancel (``CallHandle.cancel()``, ``toolexec cancel``, a caller that stopped waiting for a
tool with ``on_abandon="cancel"``; ``agent_client._io.cancels``) adds the call id to
``toolexec:cancelled`` (a sorted set scored by when the entry lapses) and publishes it on
``toolexec:cancels``. Every worker process that runs tools listens on that channel in a
thread of its own (:func:`listen`, started before the process's first call), having read
the set when it subscribed: it hears a cancel within milliseconds, and costs no Redis
command per running call.

What a process does with a cancel it heard:

* a call it has not started never starts (:func:`heard`, asked at admission, no I/O):
  it is answered ``cancelled``;
* a running call's :attr:`~executor.context.CallContext.cancelled` event is set (a
  ``def`` tool may poll it) and its ``async def`` tool's task is cancelled
  (``CancelledError`` inside the tool); the tool has its ``cancel_grace`` to unwind, and
  whatever it then ends with, the call's outcome is ``cancelled``;
* past the grace the caller is answered ``cancelled`` at once; a prefork child then
  exits, and billiard starts a fresh one (the parent counts the death as the cancel's,
  :mod:`executor.seams.request`); on the threads, solo and asyncio pools the tool runs on
  until it returns (:func:`ran_on` counts them for ``toolexec status``), its outcome dropped.

A cancelled call's outcome is never stored: the same idempotent call again runs again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import redis

from executor.worker import in_pool_child, redis_client
from wire import keys
from wire.clock import shared_now
from wire.models import CallOutcome, CallRequest, ErrorKind
from wire.settings import Settings

if TYPE_CHECKING:
    from executor.claims import Admitted

__all__ = [
    "cancelled_outcome",
    "event_for",
    "bind_task",
    "heard",
    "listen",
    "ran_on",
    "recorded",
    "requested",
    "take_answer",
    "watch",
]

logger = logging.getLogger(__name__)

#: Seconds a heard cancel is remembered (a copy of the call may still come).
_REMEMBER = 3600.0


@dataclass(eq=False)
class _Watch:
    """A call running in this process, as far as cancelling it goes."""

    admitted: Admitted
    settings: Settings
    event: threading.Event = field(default_factory=threading.Event)
    tasks: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]]] = field(default_factory=list)
    answered: bool = False
    past_grace: bool = False


_lock = threading.Lock()
#: Call id -> when its cancel was heard (monotonic), pruned after _REMEMBER.
_heard: dict[str, float] = {}
#: Call id -> the call running here.
_watches: dict[str, _Watch] = {}
_listening: dict[str, int] = {}  # redis url -> pid whose listener runs


def heard(call_id: str) -> bool:
    """Whether this process heard a cancel of ``call_id`` (no I/O)."""
    return call_id in _heard


def requested(call_id: str) -> bool:
    """Whether the call running here under ``call_id`` has been cancelled."""
    watch_ = _watches.get(call_id)
    return watch_ is not None and watch_.event.is_set()


def cancelled_outcome(call: CallRequest, *, worker: str, why: str = "") -> CallOutcome:
    """The outcome of a cancelled call."""
    return CallOutcome.failure(
        call.call_id,
        ErrorKind.CANCELLED,
        "ToolCancelled",
        why or f"the call to {call.tool!r} was cancelled",
        worker=worker,
    )


def ran_on() -> int:
    """How many cancelled tools this process answered and could not stop (they run on)."""
    with _lock:
        return sum(1 for watch_ in _watches.values() if watch_.past_grace)


def event_for(call_id: str) -> threading.Event:
    """The cancelled event of the call running here as ``call_id`` (a fresh one if none)."""
    watch_ = _watches.get(call_id)
    return watch_.event if watch_ is not None else threading.Event()


def bind_task(call_id: str, task: asyncio.Future[Any], loop: asyncio.AbstractEventLoop) -> None:
    """Cancel ``task`` (an ``async def`` tool's, on ``loop``) when the call is."""
    watch_ = _watches.get(call_id)
    if watch_ is None:
        return
    with _lock:
        watch_.tasks.append((loop, task))
        cancelled = watch_.event.is_set()
    if cancelled:
        task.cancel()


@contextmanager
def watch(admitted: Admitted, settings: Settings) -> Iterator[None]:
    """Make the admitted call cancellable while the block runs it."""
    call_id = admitted.call.call_id
    entry = _Watch(admitted=admitted, settings=settings)
    with _lock:
        _watches[call_id] = entry
        heard_before = call_id in _heard  # between its admission and now
    if heard_before:
        _stop(entry)
    try:
        yield
    finally:
        with _lock:
            if _watches.get(call_id) is entry:
                del _watches[call_id]


def take_answer(call_id: str) -> bool:
    """Whether this delivery still answers ``call_id`` (False once the cancel's grace
    answered it: the tool's own outcome is then dropped)."""
    watch_ = _watches.get(call_id)
    if watch_ is None:
        return True
    with _lock:
        if watch_.answered:
            return False
        watch_.answered = True
        return True


def recorded(call_id: str, settings: Settings) -> bool:
    """Whether ``call_id`` was cancelled, as Redis says (a prefork parent, on a child's death)."""
    if heard(call_id):
        return True
    try:
        return redis_client(settings).zscore(keys.CANCELLED, call_id) is not None
    except redis.RedisError:
        return False


# -- the listener ---------------------------------------------------------------------


def listen(settings: Settings) -> None:
    """Start this process's cancel listener, once per process, and return once it has
    subscribed and read the cancels already made (call before a process's first call)."""
    url = settings.redis_url
    if _listening.get(url) == os.getpid():
        return
    with _lock:
        if _listening.get(url) == os.getpid():
            return
        ready = threading.Event()
        thread = threading.Thread(
            target=_listen, args=(settings, ready), daemon=True, name="toolexec-cancels"
        )
        thread.start()
        _listening[url] = os.getpid()
    # Redis slow or away: calls run, and cancels are heard once it answers. An event
    # loop (the asyncio pool's) never waits for it.
    ready.wait(0.0 if _on_a_loop() else 1.0)


def _on_a_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _listen(settings: Settings, ready: threading.Event) -> None:
    backoff = 0.1
    while True:
        try:
            _subscribed(settings, ready)
        except Exception as exc:  # noqa: BLE001 - Redis away: subscribe again
            logger.debug(
                "the cancel listener lost Redis (%s); subscribing again", type(exc).__name__
            )
            ready.set()
        time.sleep(backoff)
        backoff = min(2.0, backoff * 2)


def _subscribed(settings: Settings, ready: threading.Event) -> None:
    client = redis.Redis.from_url(
        settings.redis_url, socket_connect_timeout=5, health_check_interval=0
    )
    pubsub = cast(Any, client).pubsub(ignore_subscribe_messages=True)
    try:
        pubsub.subscribe(keys.CANCELS)
        pubsub.get_message(timeout=5.0)  # the subscription's confirmation
        for call_id in redis_client(settings).zrangebyscore(keys.CANCELLED, shared_now(), "+inf"):
            _heard_of(call_id.decode() if isinstance(call_id, bytes) else str(call_id))
        ready.set()
        while True:
            message = pubsub.get_message(timeout=30.0)
            if message is not None and message.get("type") == "message":
                data = message.get("data")
                _heard_of(data.decode() if isinstance(data, bytes) else str(data))
    finally:
        pubsub.close()
        client.close()


def _heard_of(call_id: str) -> None:
    now = time.monotonic()
    with _lock:
        _heard[call_id] = now
        if len(_heard) > 10_000:
            for old in [c for c, t in _heard.items() if now - t > _REMEMBER]:
                del _heard[old]
        watch_ = _watches.get(call_id)
    if watch_ is not None:
        _stop(watch_)


def _stop(watch_: _Watch) -> None:
    # A cancel heard of a call running here: its event, its task, then its grace.
    call_id = watch_.admitted.call.call_id
    with _lock:
        if watch_.event.is_set():
            return
        watch_.event.set()
        tasks = list(watch_.tasks)
    logger.info("call %s is cancelled; stopping it", call_id)
    for loop, task in tasks:
        try:
            loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:
            pass  # its loop has closed: the task has ended
    definition = watch_.admitted.definition
    grace = definition.spec.cancel_grace if definition is not None else 1.0
    timer = threading.Timer(grace, _past_grace, args=(watch_,))
    timer.daemon = True
    timer.start()


def _past_grace(watch_: _Watch) -> None:
    # The tool did not end within its grace: answer its caller now.
    call = watch_.admitted.call
    if _watches.get(call.call_id) is not watch_ or not take_answer(call.call_id):
        return
    from executor.claims import running_here
    from executor.delivery import finish

    worker = watch_.admitted.holder.split(" ", 1)[0]
    outcome = cancelled_outcome(
        call,
        worker=worker,
        why=f"the call to {call.tool!r} was cancelled and did not end within its grace",
    )
    try:
        with running_here.completing(watch_.admitted):
            finish(
                call, outcome, settings=watch_.settings, store=False, holder=watch_.admitted.holder
            )
    finally:
        if in_pool_child():
            logger.warning(
                "call %s did not end within its cancel grace; this pool process exits", call.call_id
            )
            _exit()
        watch_.past_grace = True
        logger.warning(
            "call %s did not end within its cancel grace; its tool runs on", call.call_id
        )


def _exit() -> None:
    os._exit(0)  # the pool starts a fresh process; the outcome is delivered
