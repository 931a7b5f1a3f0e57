"""Free the claim of an idempotent call whose message was never published.

With a broker apart from Redis (RabbitMQ, or a second Redis), an idempotent call is
sent in two steps: the claim script claims its key in Redis without pushing
(:data:`wire.scripts.CLAIM`, ``push=0``), then the message is published to the broker
(:mod:`agent_client.send`, :mod:`agent_client.amqp`). When the publish never happens
(the broker cannot be reached until the caller's deadline, or the caller gave up), the
claim would hold the key until its TTL: every retry of the call in the run would join
an execution that does not exist. So a send dropped before any write of its message
may have reached the broker releases its claim (:data:`wire.scripts.RELEASE`: only if
the claim still holds this call's id), and its caller hears ``BrokerUnavailable``.

A send whose publish may have reached the broker (its fate unknown) keeps its claim:
the message may run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from agent_client.io import Arg, IOThread, Link, NotSent, Refused, Unknown
from wire import keys
from wire.scripts import RELEASE

if TYPE_CHECKING:
    from agent_client.send import Send

__all__ = ["release_on_stop", "release_unsent_claims", "unsent_claims"]

logger = logging.getLogger(__name__)

#: Seconds the release may take.
_TIMEOUT = 2.0

#: Releases under way (a task only weakly referenced by its loop may be collected).
_running: set[asyncio.Task[None]] = set()


def unsent_claims(items: Iterable[Send]) -> list[Send]:
    """The sends among ``items`` that hold a claim and of which nothing was published."""
    return [
        item
        for item in items
        if item.push_only
        and item.call.idempotency_key is not None
        and not item.state.written
        and not item.state.confirmed
    ]


def release_unsent_claims(io: IOThread, store_url: str, dropped: Iterable[Send]) -> None:
    """Release, in the background, the claims of the dropped sends never published.

    Call on the I/O thread's loop with the sends a lane dropped (deadline passed, caller
    gone); the others among them are left alone.
    """
    claimed = unsent_claims(dropped)
    if not claimed:
        return
    task = asyncio.get_running_loop().create_task(_release(io.link(store_url, "release"), claimed))
    _running.add(task)
    task.add_done_callback(_running.discard)


async def release_on_stop(io: IOThread, store_url: str, queued: Iterable[Send]) -> None:
    """When a lane stops: release the claims of the sends still queued, and wait for every
    release under way on this loop (bounded by the release's timeout)."""
    claimed = unsent_claims(queued)
    loop = asyncio.get_running_loop()
    waiting = [task for task in _running if task.get_loop() is loop]
    if claimed:
        waiting.append(loop.create_task(_release(io.link(store_url, "release"), claimed)))
    if waiting:
        await asyncio.wait(waiting, timeout=_TIMEOUT)


async def _release(link: Link, items: Sequence[Send]) -> None:
    commands: list[tuple[Arg, ...]] = []
    for item in items:
        key = item.call.idempotency_key
        assert key is not None
        commands.append(RELEASE.command([keys.claim(key)], [item.call.call_id]))
    try:
        replies = await link.execute(commands, timeout=_TIMEOUT)
    except NotSent as exc:
        logger.warning(
            "could not release %d unsent claims (%s); they expire with their TTL", len(items), exc
        )
        return
    failed = sum(1 for r in replies if isinstance(r, Refused | Unknown))
    if failed:
        logger.warning("could not release %d unsent claims; they expire with their TTL", failed)
