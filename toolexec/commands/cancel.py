"""``toolexec cancel CALL_ID``: cancel a call from any shell.

A submitted call (``RemoteTool.submit``) is found by its record: a copy still in its
Redis queue is taken off (it never starts) and its waiters are told ``ToolCancelled``.
Any call, submitted or not, is cancelled on the workers: a queued copy never starts and a
running one is stopped (``executor.cancels``). An id Redis keeps no trace of (no record,
no sent marker, no running record) is refused with exit code 4: nothing is cancelled.
"""

from __future__ import annotations

import json
from typing import TextIO

from agent_client import BrokerUnavailable, ToolClient
from agent_client._io import cancels
from agent_client._io.cancels import cancel_call
from agent_client._io.link import Link, NotSent, Refused, Unknown
from toolexec.commands.exits import CommandFailed, ExitCode, one_line
from wire import keys

__all__ = ["cancel_call_command"]


def cancel_call_command(client: ToolClient, call_id: str, *, as_json: bool, out: TextIO) -> None:
    """Cancel ``call_id`` and say what it was doing.

    Raises:
        CommandFailed: The call had ended (exit 1), no call of that id is known (exit 4),
            or Redis did not answer (exit 5).
    """
    if not call_id.strip():
        raise CommandFailed("give the call's id (CallHandle.id)", ExitCode.BAD_ARGUMENTS)

    async def work() -> tuple[str, bool | None]:
        store = client.io.link(client.settings.redis_url, "read")
        try:
            record = await cancels.read_record(store, call_id)
        except NotSent as exc:
            raise BrokerUnavailable(f"cannot read call {call_id}: {exc}") from None
        was = record.get("status", "unknown")
        if was == "unknown" and not await _known(store, call_id):
            return was, None
        done = await cancel_call(
            client,
            call_id,
            tool=record.get("tool", ""),
            queue="",
            envelope="",
            generations=client.settings.max_deliveries,
        )
        return was, done

    try:
        was, done = client.io.run(work, timeout=3 * cancels.TIMEOUT + 1)
    except (BrokerUnavailable, TimeoutError) as exc:
        raise CommandFailed(
            one_line(str(exc) or "Redis did not answer in time"), ExitCode.BROKER_UNAVAILABLE
        ) from None
    if done is None:
        raise CommandFailed(
            f"no call {call_id} is known: no submitted call, sent message or running call of that "
            "id is kept in Redis (check the id: CallHandle.id, or a RemoteToolError's call_id); "
            "nothing was cancelled",
            ExitCode.NOT_FOUND,
        )
    if not done:
        raise CommandFailed(
            f"call {call_id} had ended ({was}): nothing to cancel", ExitCode.TOOL_ERROR
        )
    if as_json:
        out.write(json.dumps({"call_id": call_id, "cancelled": True, "was": was}) + "\n")
    elif was == "unknown":
        out.write(
            f"cancelled {call_id} on the workers (no submitted call of that id is kept: a queued "
            "or running call of it stops)\n"
        )
    else:
        out.write(f"cancelled {call_id} (it was {was})\n")


async def _known(store: Link, call_id: str) -> bool:
    """Whether Redis keeps any trace of a call ``call_id`` that has no record: the marker
    of its sent message, or the record of who runs it."""
    (reply,) = await store.execute(
        [("EXISTS", keys.sent(call_id), keys.running(call_id))], timeout=cancels.TIMEOUT
    )
    if isinstance(reply, Refused | Unknown):
        raise BrokerUnavailable(f"cannot read call {call_id}: {reply.error}")
    return bool(reply)
