"""The bytes of Redis commands on the wire (RESP), packed by hiredis.

redis-py packs a command with hiredis too, when it is installed (it is a dependency of
toolexec), but first passes over every argument in Python: its encoder, a check for
memory views, a split of a first argument that holds a space. For commands whose
arguments are already text, bytes or numbers, that pass costs several times what
hiredis' packing does (``python -m bench.resp`` prints both, per command). Two ways round
it, both held to redis-py's bytes, argument type by argument type, by
``tests/contract/test_resp_packing.py``:

* :func:`pack`: the client's link (``agent_client._io.link``) packs its pipelines itself;
* :data:`PACKER`: redis-py's ``command_packer`` connection option, which every blocking
  client :func:`wire.connect.sync_client` makes carries (a worker's deliveries, claims,
  run log and heartbeat); a command hiredis will not take as it is goes redis-py's way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import hiredis
import redis

__all__ = ["PACKER", "Arg", "Packer", "pack"]

#: One argument of a Redis command (never a bool: Redis has none, and neither packer
#: takes one).
Arg = str | bytes | int | float


def pack(commands: Sequence[Sequence[Arg]]) -> bytes:
    """The RESP bytes of ``commands``, one after the other (a pipeline).

    Raises:
        redis.DataError: An argument is none of text, bytes, int or float (a bool, None,
            a list), as redis-py's own packing raises.
    """
    try:
        # hiredis' stub types its argument as a tuple of one element: any length is taken.
        return b"".join([hiredis.pack_command(tuple(command)) for command in commands])  # type: ignore[arg-type]
    except TypeError as exc:
        raise redis.DataError(f"a Redis command's argument of the wrong type: {exc}") from None


class Packer:
    """redis-py's command packer, hiredis' packing without redis-py's pass over the
    arguments (a blocking connection's ``command_packer`` option; shared, as it keeps no
    state).

    A command hiredis will not take as it is, redis-py packs its own way: an argument of
    another type (a ``bytearray``; redis-py's ``DataError`` for a bool or None), or a first
    word holding a space (``"CONFIG GET"``, which redis-py splits).
    """

    def __init__(self) -> None:
        # A connection never connected, for its packing alone (redis-py's default packer).
        self._redis_pys = redis.connection.Connection()  # type: ignore[no-untyped-call]

    def pack(self, *args: Any) -> list[bytes]:
        """``args`` (a command's words) as RESP, in the list redis-py's packers return."""
        first = args[0]
        if not (b" " in first if isinstance(first, bytes) else " " in str(first)):
            try:
                return [hiredis.pack_command(args)]
            except TypeError:
                pass
        packed: list[bytes] = self._redis_pys.pack_command(*args)  # type: ignore[no-untyped-call]
        return packed


#: The packer of every blocking Redis client of the product (:func:`wire.connect.sync_client`).
PACKER = Packer()
