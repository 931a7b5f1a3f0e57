"""Deliver an outcome to its caller: counted, encoded, and pushed through Redis blips.

Every outcome a worker sends goes out here, whoever sends it: the task body after a
call ran or was refused (:mod:`executor.task`), and the reply backend for a call the
worker's main process saw lost (:mod:`executor.seams.backend`). :func:`finish` counts
it (Prometheus, :mod:`executor.metrics`; ``toolexec status``, :mod:`executor.stats`),
encodes it (:func:`executor.outcomes.encode_outcome`) and completes the call
(:func:`executor.claims.complete`: the caller, every joiner, and the store when the tool
keeps outcomes). Redis may blip meanwhile (it restarts, say): each push is tried again
for :data:`_DELIVERY_PATIENCE` seconds before the outcome is given up and logged.

On the asyncio pool, plain calls (no idempotency key) that end at the same moment share
one pipeline (:func:`push_plain`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

import redis

from executor import observe
from executor.claims import complete, queue_reply
from executor.outcomes import encode_outcome
from executor.tracing import call_log_fields
from executor.worker import redis_client, retry_pauses
from wire import keys
from wire.handles import END, START, status_of
from wire.models import CallOutcome, CallRequest
from wire.settings import Settings

__all__ = ["deliver_encoded", "finish", "mark_running", "push_plain", "record_and_encode"]

logger = logging.getLogger(__name__)

#: How long a worker keeps trying to deliver an outcome while Redis is unreachable.
_DELIVERY_PATIENCE = 5.0


def finish(
    call: CallRequest,
    outcome: CallOutcome,
    *,
    settings: Settings,
    store: bool = False,
    holder: str = "",
) -> None:
    """Deliver ``outcome`` to the caller of ``call`` (and its joiners); store it if asked."""
    encoded = record_and_encode(call, outcome, settings=settings)
    deliver_encoded(
        redis_client(settings), call, encoded, settings=settings, store=store, holder=holder
    )


def record_and_encode(call: CallRequest, outcome: CallOutcome, *, settings: Settings) -> str:
    """Count ``outcome`` as delivered (:mod:`executor.observe`) and encode it for the wire."""
    observe.delivered(call, outcome, settings=settings)
    return encode_outcome(outcome, tool=call.tool, max_bytes=settings.max_result_bytes)


def deliver_encoded(
    client: redis.Redis,
    call: CallRequest,
    encoded: str,
    *,
    settings: Settings,
    store: bool,
    holder: str,
) -> None:
    """Complete ``call`` with an outcome already encoded (a stored one, say), through blips."""

    # A second COMPLETE after a first that landed only pushes a duplicate frame, which
    # the client drops (nobody waits for that call id any more).
    def deliver() -> None:
        complete(
            client,
            call,
            encoded,
            store=store,
            holder=holder,
            outcome_ttl=settings.outcome_ttl,
            reply_ttl=settings.reply_ttl,
            replicas=settings.replica_acks,
        )
        if call.handle:
            _end_record(client, call, encoded, settings=settings)

    _through_blips(deliver, [call])


def push_plain(delivered: list[tuple[CallRequest, str, Settings]]) -> None:
    """:func:`deliver_encoded` for many plain calls, encoded by :func:`record_and_encode`:
    their replies pushed in one pipeline for each Redis their settings name.

    A second push after one that landed is a duplicate frame, which the client drops.
    """
    by_settings: dict[int, tuple[Settings, list[tuple[CallRequest, str]]]] = {}
    for call, encoded, settings in delivered:
        by_settings.setdefault(id(settings), (settings, []))[1].append((call, encoded))
    for settings, replies in by_settings.values():
        push = functools.partial(_push_replies, redis_client(settings), replies, settings=settings)
        _through_blips(push, [call for call, _ in replies])


def _push_replies(
    client: redis.Redis, replies: list[tuple[CallRequest, str]], *, settings: Settings
) -> None:
    pipe = client.pipeline(transaction=False)
    for call, encoded in replies:
        queue_reply(pipe, call, encoded, reply_ttl=settings.reply_ttl)
    if len(pipe):
        pipe.execute()
    for call, encoded in replies:
        if call.handle:
            _end_record(client, call, encoded, settings=settings)


def mark_running(call: CallRequest, *, worker: str, settings: Settings) -> None:
    """Mark a submitted call's record ``running`` (``wire.handles.START``); a Redis error
    leaves it ``queued`` (its status is a view; the outcome still ends the record)."""
    try:
        START.run(
            redis_client(settings),
            [keys.handle(call.call_id)],
            [worker, f"{time.time():.3f}", settings.handle_ttl * 1000],
        )
    except redis.RedisError as exc:
        logger.debug("could not mark call %s running: %s", call.call_id, type(exc).__name__)


def _end_record(
    client: redis.Redis, call: CallRequest, encoded: str, *, settings: Settings
) -> None:
    # A submitted call's record takes its outcome, for every process attached to it
    # (its sender has its frame from complete()/the push already).
    outcome = CallOutcome.model_validate_json(encoded)
    END.run(
        client,
        [keys.handle(call.call_id), keys.handle_waiters(call.call_id)],
        [
            status_of(outcome.ok, outcome.error.kind.value if outcome.error else None),
            encoded,
            f"{time.time():.3f}",
            settings.handle_ttl * 1000,
            settings.reply_ttl,
            keys.reply(""),
            "0",
        ],
    )


def _through_blips(deliver: Callable[[], None], calls: list[CallRequest]) -> None:
    """Run ``deliver``, trying again with backoff for :data:`_DELIVERY_PATIENCE` while
    Redis errs: a Redis blip must not lose an outcome. Logs each call it gave up."""
    pauses = retry_pauses(_DELIVERY_PATIENCE)
    while True:
        try:
            deliver()
            return
        except redis.RedisError as exc:
            pause = next(pauses, None)
            if pause is None:
                for call in calls:
                    logger.error(
                        "could not deliver the outcome of call %s of %s: %s",
                        call.call_id,
                        call.tool,
                        exc,
                        extra=call_log_fields(call.call_id, call.run_id, call.tool),
                    )
                return
            time.sleep(pause)
