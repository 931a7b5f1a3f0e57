"""Settle a waiting call's future from any thread, whichever kind it is.

A sync caller waits on a ``concurrent.futures.Future``; an async caller on an
``asyncio.Future`` of its own loop, which only that loop's thread may touch. The
listener thread settles many at once: one ``call_soon_threadsafe`` per loop per batch,
not one wake-up per reply.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Iterable
from typing import Any, TypeAlias

__all__ = ["Waiter", "settle", "settle_from_thread"]

Waiter: TypeAlias = "concurrent.futures.Future[Any] | asyncio.Future[Any]"


def settle(future: Waiter, *, result: Any = None, error: BaseException | None = None) -> None:
    """Set a result or error on a future owned by the current thread (or a sync one)."""
    if isinstance(future, asyncio.Future):
        if not future.done():
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)
        return
    with contextlib.suppress(concurrent.futures.InvalidStateError):  # the caller gave up
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


def settle_from_thread(items: Iterable[tuple[Waiter, Any, BaseException | None]]) -> None:
    """Settle futures from a foreign thread: sync ones now, async ones on their loops."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Waiter, Any, BaseException | None]]] = {}
    for future, result, error in items:
        if isinstance(future, asyncio.Future):
            by_loop.setdefault(future.get_loop(), []).append((future, result, error))
        else:
            settle(future, result=result, error=error)
    for loop, batch in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(_settle_all, batch)


def _settle_all(batch: list[tuple[Waiter, Any, BaseException | None]]) -> None:
    for future, result, error in batch:
        settle(future, result=result, error=error)
