"""``python -m bench.resp``: what packing a Redis command costs, redis-py's way and
toolexec's (:mod:`wire.resp`), in microseconds per command.

No Redis is needed: each side packs the same commands into the same bytes
(``tests/contract/test_resp_packing.py``). redis-py hands each command to hiredis after a
pass over its arguments in Python; :func:`wire.resp.pack` (the client's link) and a
blocking connection with :data:`wire.resp.PACKER` (every blocking client of the product:
the worker's) hand it over as it is. Each figure is the median of ``--repeats`` runs of
``--commands`` commands.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

import redis.connection
from redis.asyncio.connection import Connection

from wire import keys
from wire.resp import PACKER, Arg, pack
from wire.runlog import SENT, event, xadd_arguments

__all__ = ["COMMANDS", "main", "measure"]

#: Commands as the client sends them: its run log's event, a keyed call's claim, a call's
#: message pushed on its queue (an envelope of about 1 KiB).
COMMANDS: dict[str, tuple[Arg, ...]] = {
    "run log XADD (20 arguments)": tuple(
        xadd_arguments(
            keys.run_log("run-3f2a9c"),
            event(
                SENT,
                "9b1d0c6e4f2a4d6c8e1f3a5b7c9d0e1f",
                {"tool": "search", "queue": "tools", "deadline": 1_765_000_005_000},
                at=1_765_000_000_000,
            ),
            max_events=10_000,
        )
    ),
    "EVALSHA (2 keys, 3 arguments)": (
        "EVALSHA",
        "e0e1f9fabfc9d4800c877a703b823ac0578ff831",
        2,
        "toolexec:claim:run-3f2a9c:search:ab12",
        "toolexec:sent:9b1d0c6e",
        30_000,
        "9b1d0c6e4f2a4d6c8e1f3a5b7c9d0e1f",
        1.5,
    ),
    "LPUSH (a 1 KiB message)": ("LPUSH", "tools", b"x" * 1024),
}


def measure(
    pack_one: Callable[[Sequence[Sequence[Arg]]], object], command: tuple[Arg, ...], n: int
) -> float:
    """Seconds per command that ``pack_one`` takes on a pipeline of ``n`` copies."""
    batch = [command] * n
    started = time.perf_counter()
    pack_one(batch)
    return (time.perf_counter() - started) / n


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.resp", description=__doc__)
    parser.add_argument("--commands", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    sides: dict[str, Callable[[Sequence[Sequence[Arg]]], object]] = {
        "redis-py, asyncio": Connection().pack_commands,
        "wire.resp.pack (the client's link)": pack,
        "redis-py, blocking": redis.connection.Connection().pack_commands,  # type: ignore[no-untyped-call]
        "blocking, wire.resp.PACKER (the worker)": redis.connection.Connection(  # type: ignore[no-untyped-call]
            command_packer=PACKER
        ).pack_commands,
    }
    print("µs per command, packed in pipelines of", f"{args.commands:,}", "\n")
    print("| command | " + " | ".join(sides) + " |")
    print("|---" * (len(sides) + 1) + "|")
    for name, command in COMMANDS.items():
        medians = [
            statistics.median(measure(packer, command, args.commands) for _ in range(args.repeats))
            for packer in sides.values()
        ]
        print(f"| {name} | " + " | ".join(f"{m * 1e6:.2f}" for m in medians) + " |")


if __name__ == "__main__":
    main()
