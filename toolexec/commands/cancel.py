"""``toolexec cancel CALL_ID``: cancel a call from any shell.

A submitted call (``RemoteTool.submit``) is found by its record: a copy still in its
Redis queue is taken off (it never starts) and its waiters are told ``ToolCancelled``.
Any call, submitted or not, is cancelled on the workers: a queued copy never starts and a
running one is stopped (``executor.cancels``).
"""

from __future__ import annotations

import json
from typing import TextIO

from agent_client import BrokerUnavailable, ToolClient
from agent_client._io import cancels
from agent_client._io.link import NotSent
from agent_client.cancel import cancel_call
from toolexec.commands.exits import CommandFailed, ExitCode, one_line

__all__ = ["cancel_call_command"]


def cancel_call_command(client: ToolClient, call_id: str, *, as_json: bool, out: TextIO) -> None:
    """Cancel ``call_id`` and say what it was doing.

    Raises:
        CommandFailed: The call had ended (exit 1), or Redis did not answer (exit 5).
    """
    if not call_id.strip():
        raise CommandFailed("give the call's id (CallHandle.id)", ExitCode.BAD_ARGUMENTS)

    async def work() -> tuple[str, bool]:
        store = client.io.link(client.settings.redis_url, "read")
        try:
            record = await cancels.read_record(store, call_id)
        except NotSent as exc:
            raise BrokerUnavailable(f"cannot read call {call_id}: {exc}") from None
        was = record.get("status", "unknown")
        done = await cancel_call(
            client, call_id, tool=record.get("tool", ""), queue="", envelope="",
            generations=client.settings.max_deliveries,
        )  # fmt: skip
        return was, done

    try:
        was, done = client.io.run(work, timeout=3 * cancels.TIMEOUT + 1)
    except (BrokerUnavailable, TimeoutError) as exc:
        raise CommandFailed(one_line(str(exc) or "Redis did not answer in time"), ExitCode.BROKER_UNAVAILABLE) from None
    if not done:
        raise CommandFailed(f"call {call_id} had ended ({was}): nothing to cancel", ExitCode.TOOL_ERROR)
    if as_json:
        out.write(json.dumps({"call_id": call_id, "cancelled": True, "was": was}) + "\n")
    elif was == "unknown":
        out.write(f"cancelled {call_id} on the workers (no submitted call of that id is kept: a queued or running call of it stops)\n")
    else:
        out.write(f"cancelled {call_id} (it was {was})\n")
