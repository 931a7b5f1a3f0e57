"""One caller of ``python -m bench chaos``: calls until told to stop, each outcome logged.

``python -m bench.chaos_caller OUT SEED SECONDS IN_FLIGHT DEADLINE`` sends calls to the
chaos tools (:mod:`bench.chaos_tools`) for ``SECONDS``, ``IN_FLIGHT`` at once, each with
``DEADLINE``, in a mix drawn from ``SEED``, and appends one JSON line per event to
``OUT``: ``{"sent": token, "tool", "at"}`` before each call and ``{"ended": token,
"outcome", "at", "took", "call_id"}`` after, flushed at once, so a caller killed mid-run
leaves what it sent. Each idempotent call runs in a run of its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import sys
import time
from typing import Any, TextIO

from agent_client import RemoteToolError, configure, remote_tool, run_scope
from bench.chaos_tools import TOOLS


def main(argv: list[str]) -> int:
    out, seed, seconds, in_flight, deadline = (
        argv[0],
        int(argv[1]),
        float(argv[2]),
        int(argv[3]),
        float(argv[4]),
    )
    # The client's warnings (a call lost, Redis away), timed, to read beside the faults.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    configure()
    with open(out, "a", buffering=1) as log:
        asyncio.run(_calls(log, random.Random(seed), seconds, in_flight, deadline))
    return 0


async def _calls(
    log: TextIO, rng: random.Random, seconds: float, in_flight: int, deadline: float
) -> None:
    proxies = {name: remote_tool(name, wait=30) for name in TOOLS}
    ends = time.monotonic() + seconds
    gate = asyncio.Semaphore(in_flight)
    prefix = f"{os.getpid()}-{rng.randrange(1 << 30):x}"
    pending: set[asyncio.Task[None]] = set()
    number = 0
    while time.monotonic() < ends:
        await gate.acquire()
        number += 1
        token = f"{prefix}-{number}"
        name = rng.choice(TOOLS)
        work = rng.choice((0.0, 0.05, 0.1, 0.3, 0.8))
        _write(log, {"sent": token, "tool": name, "at": time.time(), "deadline": deadline})
        task = asyncio.ensure_future(_one(log, proxies[name], token, work, deadline, gate))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.gather(*pending)


async def _one(
    log: TextIO, proxy: Any, token: str, work: float, deadline: float, gate: asyncio.Semaphore
) -> None:
    started = time.monotonic()
    outcome, call_id = "result", None
    try:
        with run_scope():  # each idempotent call its own run: the key is the call's
            value = await proxy.invoke({"token": token, "seconds": work}, timeout=deadline)
        if value != token:
            outcome = f"wrong result {value!r}"
    except RemoteToolError as exc:
        outcome, call_id = type(exc).__name__, exc.call_id
    except Exception as exc:  # noqa: BLE001 - an untyped error is a finding
        outcome = f"untyped {type(exc).__name__}: {exc}"
    finally:
        gate.release()
    _write(
        log,
        {
            "ended": token,
            "outcome": outcome,
            "at": time.time(),
            "took": time.monotonic() - started,
            "call_id": call_id,
        },
    )


def _write(log: TextIO, event: dict[str, Any]) -> None:
    log.write(json.dumps(event) + "\n")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
