"""Each call's cancel as this process knows it: heard, requested, its event, its tasks.

The bottom of the worker's cancellation: it imports nothing of :mod:`executor`. The
runner and the hard limits ask it whether the call they run was cancelled
(:func:`requested`, :func:`event_for`) and hand it the ``async def`` tool's task to cancel
(:func:`bind_task`); admission asks whether a cancel was heard before the call started
(:func:`heard`). What hears cancels (the listener) and what a call that does not stop
within its grace gets (the grace policy) are above it, in :mod:`executor.cancels`, which
registers each running call (:func:`running`) and reports each cancel it hears
(:func:`hear`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from wire.models import CallOutcome, CallRequest, ErrorKind

__all__ = [
    "CallCancel",
    "bind_task",
    "cancelled_outcome",
    "event_for",
    "hear",
    "heard",
    "is_running",
    "ran_on",
    "requested",
    "running",
    "take_answer",
]

logger = logging.getLogger(__name__)

#: Seconds a heard cancel is remembered (a copy of the call may still come).
REMEMBER = 3600.0
#: Heard cancels kept before the ones older than :data:`REMEMBER` are pruned.
_PRUNE_ABOVE = 10_000


@dataclass(eq=False)
class CallCancel:
    """A call running in this process, as far as cancelling it goes.

    Attributes:
        call_id: The call's id.
        on_cancel: What a cancel of it starts once (the grace policy,
            :mod:`executor.cancels`), after its event is set and its tasks cancelled.
        event: Set once the call is cancelled (the tool's ``current_call().cancelled``).
        tasks: The ``async def`` tool's tasks, and their loops, to cancel.
        answered: Whether its caller was answered (by this delivery, or by the grace).
        past_grace: Answered past its grace while its tool runs on.
    """

    call_id: str
    on_cancel: Callable[[CallCancel], None]
    event: threading.Event = field(default_factory=threading.Event)
    tasks: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[Any]]] = field(default_factory=list)
    answered: bool = False
    past_grace: bool = False


_lock = threading.Lock()
#: Call id -> when its cancel was heard (monotonic), pruned after REMEMBER.
_heard: dict[str, float] = {}
#: Call id -> the call running here.
_running: dict[str, CallCancel] = {}


def heard(call_id: str) -> bool:
    """Whether this process heard a cancel of ``call_id`` (no I/O)."""
    return call_id in _heard


def requested(call_id: str) -> bool:
    """Whether the call running here under ``call_id`` has been cancelled."""
    entry = _running.get(call_id)
    return entry is not None and entry.event.is_set()


def event_for(call_id: str) -> threading.Event:
    """The cancelled event of the call running here as ``call_id`` (a fresh one if none)."""
    entry = _running.get(call_id)
    return entry.event if entry is not None else threading.Event()


def bind_task(call_id: str, task: asyncio.Future[Any], loop: asyncio.AbstractEventLoop) -> None:
    """Cancel ``task`` (an ``async def`` tool's, on ``loop``) when the call is."""
    entry = _running.get(call_id)
    if entry is None:
        return
    with _lock:
        entry.tasks.append((loop, task))
        cancelled = entry.event.is_set()
    if cancelled:
        task.cancel()


def cancelled_outcome(call: CallRequest, *, worker: str, why: str = "") -> CallOutcome:
    """The outcome of a cancelled call."""
    return CallOutcome.failure(
        call.call_id,
        ErrorKind.CANCELLED,
        "ToolCancelled",
        why or f"the call to {call.tool!r} was cancelled",
        worker=worker,
    )


def take_answer(call_id: str) -> bool:
    """Whether the one answer of ``call_id`` is still to be given, taking it: False once
    it was (the tool's own outcome is then dropped, or the grace's is not sent)."""
    entry = _running.get(call_id)
    if entry is None:
        return True
    with _lock:
        if entry.answered:
            return False
        entry.answered = True
        return True


def ran_on() -> int:
    """How many cancelled tools this process answered and could not stop (they run on)."""
    with _lock:
        return sum(1 for entry in _running.values() if entry.past_grace)


@contextmanager
def running(call_id: str, on_cancel: Callable[[CallCancel], None]) -> Iterator[CallCancel]:
    """Make the call ``call_id`` cancellable while the block runs it; a cancel heard
    between its admission and now cancels it at once."""
    entry = CallCancel(call_id=call_id, on_cancel=on_cancel)
    with _lock:
        _running[call_id] = entry
        heard_before = call_id in _heard
    if heard_before:
        _cancel(entry)
    try:
        yield entry
    finally:
        with _lock:
            if _running.get(call_id) is entry:
                del _running[call_id]


def hear(call_id: str) -> None:
    """A cancel of ``call_id`` was heard: remember it, and cancel the call if it runs here."""
    now = time.monotonic()
    with _lock:
        _heard[call_id] = now
        if len(_heard) > _PRUNE_ABOVE:
            for old in [c for c, t in _heard.items() if now - t > REMEMBER]:
                del _heard[old]
        entry = _running.get(call_id)
    if entry is not None:
        _cancel(entry)


def is_running(entry: CallCancel) -> bool:
    """Whether ``entry`` is still the call running here under its id."""
    return _running.get(entry.call_id) is entry


def _cancel(entry: CallCancel) -> None:
    # Its event, its tasks, then what its cancel starts (once).
    with _lock:
        if entry.event.is_set():
            return
        entry.event.set()
        tasks = list(entry.tasks)
    logger.info("call %s is cancelled; stopping it", entry.call_id)
    for loop, task in tasks:
        try:
            loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:
            pass  # its loop has closed: the task has ended
    entry.on_cancel(entry)
