"""Tools for the handle and cancel tests (``test_handles.py``), on the ``handles`` queue.

Workers import this module through ``TOOLEXEC_TOOL_MODULES``; the test process never
does. Each tool notes what it did in a file of its token under ``TOOLEXEC_DATA_DIR``
(``runs/<token>``): one line per event, with the process that ran it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from pathlib import Path

from executor import current_call, report_progress, tool
from wire.settings import Settings

QUEUE = "handles"


@functools.cache
def _runs() -> Path:
    folder = Path(Settings.from_env().data_dir) / "runs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _note(token: str, what: str) -> None:
    with open(_runs() / token, "a") as record:
        record.write(f"{what} {os.getpid()}\n")


@tool(queue=QUEUE)
def slow(token: str, seconds: float) -> dict[str, object]:
    """Note a start, wait ``seconds`` (stopping early when cancelled), note an end."""
    _note(token, "start")
    cancelled = current_call().cancelled
    for step in range(int(seconds * 10)):
        report_progress(step, int(seconds * 10))
        if cancelled.wait(0.1):
            _note(token, "stopped")
            return {"token": token, "stopped": True}
    _note(token, "end")
    return {"token": token, "pid": os.getpid()}


@tool(queue=QUEUE)
def busy(token: str, seconds: float) -> str:
    """Spin for ``seconds`` without looking at the cancel."""
    _note(token, "start")
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        pass
    _note(token, "end")
    return token


@tool(queue=QUEUE)
async def waits(token: str, seconds: float) -> str:
    """Sleep ``seconds`` on the event loop; note a cancel."""
    _note(token, "start")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        _note(token, "cancelled")
        raise
    _note(token, "end")
    return token


@tool(queue=QUEUE, on_abandon="cancel", cancel_grace=0.5)
def abandoned(token: str, seconds: float) -> str:
    """As ``slow``, cancelled when its caller stops waiting."""
    _note(token, "start")
    if current_call().cancelled.wait(seconds):
        _note(token, "stopped")
        return "stopped"
    _note(token, "end")
    return token


@tool(queue=QUEUE, idempotent=True)
def keyed(token: str, seconds: float) -> str:
    """An idempotent ``slow``: note each run."""
    _note(token, "start")
    if current_call().cancelled.wait(seconds):
        _note(token, "stopped")
        return "stopped"
    _note(token, "end")
    return token
