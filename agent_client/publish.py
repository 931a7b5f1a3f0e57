"""Send calls to Redis: one round trip per batch, not per call.

A :class:`Send` is one call's message: a plain push onto its queue, or, for an
idempotent tool, a claim that pushes only if it wins (see ``agent_client.idempotency``).
:meth:`Publisher.send` writes any number of them in one pipeline: all pushes to one
queue become a single ``LPUSH``. Async callers go through a :class:`LoopBatcher`, which
gathers every call started in one turn of the event loop and sends them together at
the end of that turn, so a thousand concurrent calls cost one round trip.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, cast

import redis

from agent_client._futures import Waiter, settle
from agent_client.errors import BrokerUnavailable
from agent_client.idempotency import claim_call, load_claim_script, parse_claim
from executor.protocol import CallOutcome

__all__ = ["LoopBatcher", "Publisher", "Send"]


@dataclass(kw_only=True)
class Send:
    """One call to send, and the future its outcome resolves."""

    tool: str
    call_id: str
    queue: str
    envelope: str
    future: Waiter
    #: For an idempotent call: (key, claim TTL in ms); None for a plain push.
    claim: tuple[str, int] | None = None


class Publisher:
    """Writes batches of :class:`Send` to the broker (and the claim store)."""

    def __init__(self, broker: redis.Redis, store: redis.Redis, *, reply_to: str) -> None:
        self._broker = broker
        self._store = store
        self._reply_to = reply_to

    def send(self, batch: list[Send]) -> None:
        """Send ``batch``; on failure every future in it gets :class:`BrokerUnavailable`."""
        try:
            self._send(batch)
        except redis.RedisError as exc:
            for item in batch:
                _fail(item, exc)

    def _send(self, batch: list[Send], *, reloaded: bool = False) -> None:
        same_server = self._broker is self._store
        claims = [item for item in batch if item.claim is not None]
        plain: dict[str, list[Send]] = {}
        for item in batch:
            if item.claim is None:
                plain.setdefault(item.queue, []).append(item)
        if claims:
            pipe = self._store.pipeline(transaction=False)
            for item in claims:
                key, ttl_ms = cast(tuple[str, int], item.claim)
                claim_call(
                    pipe, key, call_id=item.call_id, reply_to=self._reply_to, ttl_ms=ttl_ms,
                    queue=item.queue, envelope=item.envelope, push=same_server,
                )  # fmt: skip
            riding: list[list[Send]] = []
            if same_server:  # the plain pushes ride along: one round trip in all
                for queue, items in plain.items():
                    pipe.lpush(queue, *(i.envelope for i in items))
                    riding.append(items)
                plain = {}
            results: list[Any] = pipe.execute(raise_on_error=False)
            for items, result in zip(riding, results[len(claims) :], strict=True):
                if isinstance(result, Exception):
                    for item in items:
                        _fail(item, result)
            resend = []
            for item, result in zip(claims, results, strict=False):
                if isinstance(result, redis.exceptions.NoScriptError):
                    resend.append(item)
                elif isinstance(result, Exception):
                    _fail(item, result)
                else:
                    self._settle_claim(item, result, plain, pushed=same_server)
            if resend:
                if reloaded:
                    raise redis.ResponseError("the claim script could not be loaded")
                load_claim_script(self._store)
                self._send(resend, reloaded=True)
        if plain:
            pipe = self._broker.pipeline(transaction=False)
            for queue, items in plain.items():
                pipe.lpush(queue, *(i.envelope for i in items))
            pipe.execute()

    @staticmethod
    def _settle_claim(item: Send, result: Any, plain: dict[str, list[Send]], *, pushed: bool) -> None:
        state, stored = parse_claim(result)
        if state == "stored":
            settle(item.future, result=CallOutcome.model_validate_json(stored))
        elif state == "claimed" and not pushed:
            plain.setdefault(item.queue, []).append(item)


def _fail(item: Send, exc: Exception) -> None:
    # A batch is sent on its callers' loop (or, sync, on the caller's thread).
    settle(item.future, error=BrokerUnavailable(f"cannot send the call to {item.tool!r}: {exc}", tool=item.tool))


class LoopBatcher:
    """Collects the sends of one event-loop turn and flushes them at its end."""

    def __init__(self, loop: asyncio.AbstractEventLoop, publisher: Publisher) -> None:
        self.loop = loop
        self._publisher = publisher
        self._pending: list[Send] = []

    def add(self, item: Send) -> None:
        """Queue ``item``; the batch goes out once the current loop turn's work is done."""
        if not self._pending:
            self.loop.call_soon(self._flush)
        self._pending.append(item)

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        self._publisher.send(batch)
