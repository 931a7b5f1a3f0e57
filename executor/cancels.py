"""Cancel, on the worker: hear a cancel, and the grace a running call gets to stop.

A cancel (``CallHandle.cancel()``, ``toolexec cancel``, a caller that stopped waiting for a
tool with ``on_abandon="cancel"``; ``agent_client._io.cancels``) adds the call id to
``toolexec:cancelled`` (a sorted set scored by when the entry lapses) and publishes it on
``toolexec:cancels``. Every worker process that runs tools listens on that channel in a
thread of its own (:func:`listen`, started before the process's first call), having read
the set when it subscribed: it hears a cancel within milliseconds, and costs no Redis
command per running call.

What a process does with a cancel it heard:

* a call it has not started never starts (:func:`executor.cancel_state.heard`, asked at
  admission, no I/O): it is answered ``cancelled``;
* a running call's :attr:`~executor.context.CallContext.cancelled` event is set (a
  ``def`` tool may poll it) and its ``async def`` tool's task is cancelled
  (``CancelledError`` inside the tool); the tool has its ``cancel_grace`` to unwind, and
  whatever it then ends with, the call's outcome is ``cancelled``;
* past the grace the caller is answered ``cancelled`` at once; a prefork child then
  exits, and billiard starts a fresh one (the parent counts the death as the cancel's,
  :mod:`executor.seams.request`); on the threads, solo and asyncio pools the tool runs on
  until it returns (:func:`ran_on` counts them for ``toolexec status``), its outcome dropped.

A cancelled call's outcome is never stored: the same idempotent call again runs again.

Each call's own cancel (its event, its tasks, whether it was answered) is
:mod:`executor.cancel_state`'s, below the runner; this module is the policy above it: the
listener, and what a call that does not stop within its grace gets (:func:`watch`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import redis

from executor import cancel_state
from executor.cancel_state import CallCancel
from executor.claims import Admitted, running_here
from executor.delivery import finish
from executor.worker import in_pool_child, redis_client
from wire import keys
from wire.clock import shared_now
from wire.connect import sync_client
from wire.settings import Settings

__all__ = ["listen", "recorded", "watch"]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_listening: dict[str, int] = {}  # redis url -> pid whose listener runs


@contextmanager
def watch(admitted: Admitted, settings: Settings) -> Iterator[None]:
    """Make the admitted call cancellable while the block runs it: a cancel sets its
    event, cancels its tasks, and gives it its tool's ``cancel_grace`` to end."""
    grace = functools.partial(_start_grace, admitted, settings)
    with cancel_state.running(admitted.call.call_id, grace):
        yield


def recorded(call_id: str, settings: Settings) -> bool:
    """Whether ``call_id`` was cancelled, as Redis says (a prefork parent, on a child's death)."""
    if cancel_state.heard(call_id):
        return True
    try:
        return redis_client(settings).zscore(keys.CANCELLED, call_id) is not None
    except redis.RedisError:
        return False


# -- the grace ----------------------------------------------------------------------


def _start_grace(admitted: Admitted, settings: Settings, entry: CallCancel) -> None:
    definition = admitted.definition
    grace = definition.spec.cancel_grace if definition is not None else 1.0
    timer = threading.Timer(grace, _past_grace, args=(admitted, settings, entry))
    timer.daemon = True
    timer.start()


def _past_grace(admitted: Admitted, settings: Settings, entry: CallCancel) -> None:
    # The tool did not end within its grace: answer its caller now.
    call = admitted.call
    if not cancel_state.is_running(entry) or not cancel_state.take_answer(call.call_id):
        return
    worker = admitted.holder.split(" ", 1)[0]
    outcome = cancel_state.cancelled_outcome(
        call,
        worker=worker,
        why=f"the call to {call.tool!r} was cancelled and did not end within its grace",
    )
    try:
        with running_here.completing(admitted):
            finish(call, outcome, settings=settings, store=False, holder=admitted.holder)
    finally:
        if in_pool_child():
            logger.warning(
                "call %s did not end within its cancel grace; this pool process exits", call.call_id
            )
            _exit()
        entry.past_grace = True
        logger.warning(
            "call %s did not end within its cancel grace; its tool runs on", call.call_id
        )


def _exit() -> None:
    os._exit(0)  # the pool starts a fresh process; the outcome is delivered


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
    client = sync_client(
        settings.redis_url,
        master=settings.sentinel_master,
        socket_connect_timeout=5,
        health_check_interval=0,
    )
    pubsub = cast(Any, client).pubsub(ignore_subscribe_messages=True)
    try:
        pubsub.subscribe(keys.CANCELS)
        pubsub.get_message(timeout=5.0)  # the subscription's confirmation
        for call_id in redis_client(settings).zrangebyscore(keys.CANCELLED, shared_now(), "+inf"):
            cancel_state.hear(call_id.decode() if isinstance(call_id, bytes) else str(call_id))
        ready.set()
        while True:
            message = pubsub.get_message(timeout=30.0)
            if message is not None and message.get("type") == "message":
                data = message.get("data")
                cancel_state.hear(data.decode() if isinstance(data, bytes) else str(data))
    finally:
        pubsub.close()
        client.close()
