"""Tools for the deploy and outage tests (``test_deploys.py``), served on the ``deploys`` queue.

Workers import this module through ``TOOLEXEC_TOOL_MODULES``; the test process never
does. Each tool writes what it did to a file of its token under ``TOOLEXEC_DATA_DIR``
(``runs/<token>``), one line per start and per end with the process that ran it: a file
append needs no Redis, so the record holds while the tests take Redis away.
"""

from __future__ import annotations

import ctypes
import functools
import os
import time
from pathlib import Path

from executor import tool
from wire.settings import Settings

#: The queue every tool here is served on.
QUEUE = "deploys"


@functools.cache
def _runs() -> Path:
    folder = Path(Settings.from_env().data_dir) / "runs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _note(token: str, what: str) -> None:
    with open(_runs() / token, "a") as record:
        record.write(f"{what} {os.getpid()} {time.time():.3f}\n")


def _work(token: str, seconds: float) -> dict[str, object]:
    _note(token, "start")
    time.sleep(seconds)
    _note(token, "end")
    return {"token": token, "pid": os.getpid()}


@tool(queue=QUEUE)
def deploy_plain(token: str, seconds: float) -> dict[str, object]:
    """Work for `seconds` (at most once), recording each start and end under `token`.

    Args:
        token: Names the record of this call's runs.
        seconds: How long the work takes.
    """
    return _work(token, seconds)


@tool(queue=QUEUE, delivery="at_least_once")
def deploy_alo(token: str, seconds: float) -> dict[str, object]:
    """Like deploy_plain, delivered at least once.

    Args:
        token: Names the record of this call's runs.
        seconds: How long the work takes.
    """
    return _work(token, seconds)


@tool(queue=QUEUE, idempotent=True)
def deploy_idem(token: str, seconds: float) -> dict[str, object]:
    """Like deploy_plain, idempotent (so delivered at least once).

    Args:
        token: Names the record of this call's runs.
        seconds: How long the work takes.
    """
    return _work(token, seconds)


@tool(queue=QUEUE, delivery="at_least_once")
def deploy_crash(token: str) -> None:
    """Record a start under `token`, then end the process running it at once.

    Args:
        token: Names the record of this call's runs.
    """
    _note(token, "start")
    os._exit(1)


@tool(queue=QUEUE, hard_timeout=1)
def deploy_gil(token: str, seconds: int) -> dict[str, object]:
    """Hold the interpreter's lock for `seconds` in C code (libc's sleep called through
    ctypes.PyDLL, which keeps the GIL), well past the hard limit.

    Args:
        token: Names the record of this call's runs.
        seconds: How long C code holds the GIL.
    """
    _note(token, "start")
    ctypes.PyDLL(None).sleep(seconds)
    _note(token, "end")
    return {"token": token, "pid": os.getpid()}
