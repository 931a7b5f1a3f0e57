"""Waiting helpers shared by the integration tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["wait_until", "wait_until_async"]


def wait_until(
    condition: Callable[[], object], timeout: float = 10.0, interval: float = 0.02
) -> bool:
    """Poll ``condition`` until it is true or ``timeout`` seconds pass; its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return bool(condition())


async def wait_until_async(
    condition: Callable[[], object], timeout: float = 10.0, interval: float = 0.02
) -> bool:
    """:func:`wait_until` that yields to the event loop between polls."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(interval)
    return bool(condition())
