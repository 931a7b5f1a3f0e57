"""Who holds a call, so that nothing runs twice: begin, complete and release a keyed call;
same-process joins; and, on RabbitMQ, the holder an at-most-once call gets before it is
acknowledged.

**Begin and complete.** A call is recorded with who holds it (a holder tag,
:mod:`wire.formats`): under ``running:<call id>`` by the worker's heartbeat, for every
call the worker has taken, once it has held it for a moment (only a client whose call
has waited that long reads it); and, for an idempotent call, in its key's state
(:func:`wire.keys.state`) before it starts. That one state says who runs the key,
whether callers joined, or what outcome is stored (:func:`wire.formats.parse_state`).

Each step of an idempotent call is atomic where it must be, and its first delivery
sends few commands (:mod:`wire.scripts`):

* **begin**: one ``SET NX`` of the state (this delivery's holder tag). Taken means
  nothing runs the key and nothing is stored: run. Only when the state is taken does
  the begin script decide: a stored outcome is returned instead of running; a state
  nobody has begun (callers joined first) or this process's own stale one is taken; a
  live delivery's is joined as a waiter; a dead holder's (its worker's heartbeat is
  gone, or its pid on this worker has exited) is taken over.
* **complete**: an outcome that is kept goes out in one pipeline: stored in the state
  with ``SET ... GET``, whose previous value says whether anyone joined (then the
  deliver script tells every waiter), and pushed to the claimant. An outcome that is
  not kept (or a delivery answered from the store) goes through the complete script:
  it tells the claimant and every waiter and, unless an outcome is stored, frees the
  claim and drops this delivery's state, so that a retry runs the call again.

**Replicas** (``TOOLEXEC_REPLICA_ACKS=N``). Redis replicates asynchronously: a master that
dies takes with it the writes its replicas had not yet received, and a failover promotes
a replica that never saw them. For an idempotent call that loss could be its begin (so a
copy of its message, its pop lost too, runs it again on the new master) or its stored
outcome (so a repeat runs it again once the running state lapses). With N above 0 the
worker asks Redis to ``WAIT`` for N replicas after each: its tool starts only once N
replicas have its begin, and with it everything written before it on that Redis (the
client's claim; the message and its pop when the broker is the same Redis: one
replication stream, in order); a begin lost meanwhile (a failover) is made again. Once
its callers have it, its stored outcome is waited for on N replicas. A begin the
replicas do not confirm before the call's deadline (or, without one, before its running
state would lapse) does not run (:class:`~executor.errors.ReplicasBehind`, answered as an
expired call); a stored outcome they do not confirm within what is left of the deadline
(at least :data:`OUTCOME_REPLICA_WAIT`, at most :data:`REPLICA_WAIT`) is logged.

**Same-process joins.** :func:`executor.task.admit` begins a keyed call through
:data:`running_here`, which makes a second delivery of a key that runs in this same
process join it rather than run it again (the threads and asyncio pools run several
deliveries per process); :class:`Admitted` is the call a delivery must run.

**Holding on RabbitMQ.** RabbitMQ forgets a message once its consumer acknowledges it,
and it puts back by itself every message a consumer that went away had not
acknowledged. An at-most-once call is acknowledged when its pool process takes it
(Celery's ``Request.on_accepted``), before its tool runs; its worker's heartbeat names
it a third of an interval later at most. A worker that died in between took the call
with it and left no trace, and the caller's watchdog (:mod:`agent_client._io.watchdog`),
which cannot search RabbitMQ for a message, waited until the deadline, or forever
without one. So, with an ``amqp://`` broker, the holder of an at-most-once call
(``running:<call id>``, pid and all) is written

1. by the worker's request, before it acknowledges the call (:func:`hold`): an
   acknowledged call is always recorded; and
2. by a prefork pool child, before the tool starts (:func:`hold`, from
   :func:`executor.task.admit`): the child is told to run the call before the main
   process acknowledges it, so a started call is always recorded too. On the solo,
   threads and asyncio pools the request's write comes before the tool in any case.

A dead worker's record with a pid therefore means the call was acknowledged or started:
the watchdog reports ``WorkerLost``. A worker that died after writing it but before its
acknowledgement reached RabbitMQ leaves the message to be delivered again; the worker
that receives that copy finds the record (:func:`started_before`) and refuses it
(dead-lettered, ``worker_lost``) instead of running the call a second time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import redis
from redis.client import Pipeline

from executor.errors import ReplicasBehind, StoreUnavailable
from executor.registry import ToolDefinition
from executor.tracing import call_log_fields
from executor.worker import pid_alive, redis_client, retry_pauses, worker_id
from wire import keys
from wire.clock import shared_now
from wire.copies import START
from wire.formats import (
    joining_tag,
    parse_holder_tag,
    parse_state,
    reply_frame,
    running_state,
    stored_state,
    waiter_entry,
)
from wire.models import CallRequest
from wire.scripts import (
    BEGIN,
    COMPLETE,
    DELIVER,
    RELEASE,
    RELEASE_HOLDER,
    RENEW,
    BeginState,
    pair,
)
from wire.settings import Settings
from wire.urls import is_amqp_url

__all__ = [
    # Begin and complete
    "OUTCOME_REPLICA_WAIT",
    "REPLICA_WAIT",
    "begin",
    "complete",
    "queue_reply",
    "release",
    # Same-process joins
    "Admitted",
    "RunningHere",
    "running_here",
    # Copies sent again
    "START_PATIENCE",
    "may_start",
    # Holding on RabbitMQ
    "hold",
    "holds_before_ack",
    "started_before",
    "waits_for_hold",
]

logger = logging.getLogger(__name__)

_REPLY_PREFIX = keys.reply("")

#: Longest one ``WAIT`` for replicas lasts, in seconds: below the socket timeout of the
#: worker's Redis client (10 s), so that the connection does not give up first. A begin
#: whose call has longer to live waits again.
REPLICA_WAIT = 8.0
#: Shortest wait for the replicas of a stored outcome, in seconds: an outcome that comes
#: at its call's deadline still gets this long.
OUTCOME_REPLICA_WAIT = 1.0


# -- begin and complete ----------------------------------------------------------------


def begin(
    client: redis.Redis,
    call: CallRequest,
    *,
    holder: str,
    hostname: str,
    ttl_ms: int,
    patience: float = 0.0,
    replicas: int = 0,
) -> tuple[BeginState, str]:
    """Start a call: ``("run", "")``, ``("stored", outcome JSON)`` or ``("busy", holder)``.

    ``patience`` is how long another worker's heartbeat may be missing before its
    state is taken over (the heartbeat interval): a Redis restart can let every
    heartbeat key lapse for a moment, and a live holder's call must not run twice.
    A keyed call runs only once ``replicas`` replicas have its begin (see the module);
    a begin whose state is lost meanwhile (a failover) is made again.

    Raises:
        ReplicasBehind: They did not have it in time; the state is this delivery's still.
    """
    if call.idempotency_key is None:
        # No write here: the worker's heartbeat records who runs a plain call once it
        # has run for a moment (executor.worker.Heartbeat), keeping a round trip off every call.
        return "run", ""
    key = call.idempotency_key
    state_key = keys.state(key)
    left = _time_left(call, ttl_ms)
    while True:
        if client.set(state_key, running_state(holder), nx=True, px=ttl_ms):
            state, value = "run", ""
        else:
            keys_ = [state_key, keys.waiters(key)]
            waiter = waiter_entry(call.reply_to, call.call_id)
            state, value = pair(BEGIN.run(client, keys_, [holder, ttl_ms, "0", waiter]))
            if state == "busy" and not _alive(client, value, hostname=hostname, patience=patience):
                # The holder died mid-call: take over. Our waiter entry gets the outcome
                # twice at worst (once as claimant), and the client drops the second copy.
                state, value = pair(BEGIN.run(client, keys_, [holder, ttl_ms, "1", waiter]))
        if state != "run" or _replicated(
            client, call, state_key, holder=holder, ttl_ms=ttl_ms, replicas=replicas, left=left
        ):
            return cast(BeginState, state), value


def _time_left(call: CallRequest, ttl_ms: int) -> Callable[[], float]:
    """Seconds a begin may wait for replicas, from now on: until the call's deadline, or
    for a call without one, as long as its running state lasts."""
    if call.deadline is not None:
        deadline = call.deadline
        return lambda: deadline - shared_now()
    ends = time.monotonic() + ttl_ms / 1000
    return lambda: ends - time.monotonic()


def _replicated(
    client: redis.Redis,
    call: CallRequest,
    state_key: str,
    *,
    holder: str,
    ttl_ms: int,
    replicas: int,
    left: Callable[[], float],
) -> bool:
    """Whether ``replicas`` replicas have the begin just written to ``state_key`` (True,
    at once for none), or the state is not ``holder``'s any more (False: begin again).

    ``WAIT`` counts the replicas that have every write its own connection made, so each
    look writes first on the connection it waits on: the state's TTL set again, if
    ``holder`` still holds it (:data:`wire.scripts.RENEW`; a write replicated after the
    begin, and the stream is in order). Each look lasts up to :data:`REPLICA_WAIT`.

    Raises:
        ReplicasBehind: Fewer had it when ``left`` ran out.
    """
    if not replicas:
        return True
    while True:
        bound = max(1, int(min(left(), REPLICA_WAIT) * 1000))
        renewed, acks = _renew_and_wait(client, state_key, holder, ttl_ms, replicas, bound)
        if not renewed:
            return False
        if acks >= replicas:
            return True
        if left() <= 0:
            raise ReplicasBehind(
                call,
                acks=acks,
                wanted=replicas,
                holder=holder,
                why="its deadline passed" if call.deadline is not None else "its state lapsed",
            )
        logger.warning(
            "call %s of %s: Redis has its start on %d of %d replicas; waiting on",
            call.call_id,
            call.tool,
            acks,
            replicas,
            extra=call_log_fields(call.call_id, call.run_id, call.tool),
        )


def _renew_and_wait(
    client: redis.Redis, state_key: str, holder: str, ttl_ms: int, replicas: int, bound_ms: int
) -> tuple[bool, int]:
    """:data:`~wire.scripts.RENEW` then ``WAIT``, on one connection: (renewed, acks).

    The script goes by its source (``EVAL``), not by its SHA as every other run does
    (:meth:`~wire.scripts.LuaScript.run`): a ``NOSCRIPT`` (a new master after a failover
    knows no script) would fail the write while the ``WAIT`` behind it still waited.
    """
    pipe = client.pipeline(transaction=False)
    pipe.eval(RENEW.source, 1, state_key, holder, ttl_ms)
    pipe.wait(replicas, bound_ms)
    renewed, acks = pipe.execute()
    return bool(renewed), int(acks)


def complete(
    client: redis.Redis,
    call: CallRequest,
    encoded: str,
    *,
    store: bool,
    holder: str,
    outcome_ttl: int,
    reply_ttl: int,
    replicas: int = 0,
) -> None:
    """Deliver ``encoded`` to the caller (and to every joiner of an idempotent call).

    An outcome stored is then waited for on ``replicas`` replicas (see the module), once
    the caller and the joiners have it.
    """
    if call.idempotency_key is None or store:
        pipe = client.pipeline(transaction=False)
        if call.idempotency_key is not None:
            pipe.set(
                keys.state(call.idempotency_key),
                stored_state(encoded),
                px=outcome_ttl * 1000,
                get=True,
            )
        # A plain call's holder record (if a heartbeat wrote one) is left to its short
        # TTL: only a caller still waiting reads it, and this one is answered now.
        queue_reply(pipe, call, encoded, reply_ttl=reply_ttl)
        if not len(pipe):
            return
        results = pipe.execute()
        if call.idempotency_key is not None and parse_state(results[0]).waiters:
            # The waiter flag: callers joined this execution; tell each of them.
            DELIVER.run(
                client, [keys.waiters(call.idempotency_key)], [encoded, reply_ttl, _REPLY_PREFIX]
            )
        if replicas and call.idempotency_key is not None:
            _outcome_replicated(client, call, outcome_ttl=outcome_ttl, replicas=replicas)
        return
    key = call.idempotency_key
    claimant = waiter_entry(call.reply_to, call.call_id) if call.reply_to else ""
    COMPLETE.run(
        client,
        [keys.state(key), keys.waiters(key), keys.claim(key), keys.running(call.call_id)],
        [encoded, reply_ttl, _REPLY_PREFIX, claimant, holder],
    )


def _outcome_replicated(
    client: redis.Redis, call: CallRequest, *, outcome_ttl: int, replicas: int
) -> None:
    """Wait for ``replicas`` replicas to have ``call``'s stored outcome, for as long as its
    deadline leaves, at least :data:`OUTCOME_REPLICA_WAIT` and at most
    :data:`REPLICA_WAIT`; log when they do not. Its callers have it already: this only
    holds the worker's slot, and a failure here is no failure of the call."""
    assert call.idempotency_key is not None
    left = 0.0 if call.deadline is None else call.deadline - shared_now()
    bound = min(REPLICA_WAIT, max(left, OUTCOME_REPLICA_WAIT))
    try:
        pipe = client.pipeline(transaction=False)
        # A write on the connection WAIT counts (the stored state's TTL, set again).
        pipe.pexpire(keys.state(call.idempotency_key), outcome_ttl * 1000)
        pipe.wait(replicas, int(bound * 1000))
        renewed, acks = pipe.execute()
    except redis.RedisError as exc:
        renewed, acks, why = False, 0, type(exc).__name__
    else:
        why = "" if renewed else "its state was gone"
    if renewed and acks >= replicas:
        return
    logger.warning(
        "call %s of %s: Redis has its stored outcome on %d of %d replicas%s; a failover now "
        "could forget it",
        call.call_id,
        call.tool,
        acks,
        replicas,
        f" ({why})" if why else "",
        extra=call_log_fields(call.call_id, call.run_id, call.tool),
    )


def queue_reply(pipe: Pipeline, call: CallRequest, encoded: str, *, reply_ttl: int) -> None:
    """Queue on ``pipe`` the push of ``encoded`` to ``call``'s caller, if it has a reply
    address, and the refresh of its reply list's TTL."""
    if call.reply_to:
        reply = keys.reply(call.reply_to)
        pipe.rpush(reply, reply_frame(call.call_id, encoded))
        pipe.expire(reply, reply_ttl)


def release(client: redis.Redis, call: CallRequest, *, holder: str) -> bool:
    """Let go of what ``holder`` (a process that died) holds of ``call``, if it still does:
    its key's state, or a plain call's heartbeat record.

    Without this a redelivery on another worker would see the holder of a live worker
    and wait for a call that nobody runs. Callers that joined stay flagged in the
    state, so the delivery that runs the key next tells them.
    """
    if call.idempotency_key is not None:
        return bool(RELEASE_HOLDER.run(client, [keys.state(call.idempotency_key)], [holder]))
    return bool(RELEASE.run(client, [keys.running(call.call_id)], [holder]))


def _alive(client: redis.Redis, tag: str, *, hostname: str, patience: float) -> bool:
    """Whether the process ``tag`` names is alive: its pid here, or its worker's heartbeat.

    A heartbeat key that is missing is looked for again for ``patience`` seconds
    before its worker counts as dead: a beat rewrites it every third of an interval.
    """
    if not tag:
        return False
    wid, pid = parse_holder_tag(tag)
    if wid == worker_id(hostname) and pid:
        return pid_alive(pid)
    give_up = time.monotonic() + patience
    while not client.exists(keys.worker(wid)):
        if time.monotonic() >= give_up:
            return False
        time.sleep(min(0.1, patience / 10))
    return True


# -- same-process joins ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Admitted:
    """A call this delivery must run: it is valid, unexpired and begun
    (:func:`executor.task.admit`)."""

    call: CallRequest
    definition: ToolDefinition | None
    holder: str
    #: For a keyed call: its lock in :data:`running_here`, held again to complete it.
    key_lock: threading.Lock | None = None


class RunningHere:
    """The idempotency keys deliveries of this process are running.

    The begin script takes a key's state holding this process's own tag for a stale
    one and runs the call again: a prefork or solo process runs one call at a time, so
    its own holder tag is left from a delivery that ended. On the threads and asyncio pools
    another delivery of this process may still be running the key. A delivery of a key
    that runs here therefore begins under this process's joining tag
    (:func:`wire.formats.joining_tag`: the script sees a live holder and adds it as a
    waiter); each key's begin and complete hold its lock, so such a join never falls
    between the two.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[str, threading.Lock] = {}

    def begin(
        self,
        client: redis.Redis,
        call: CallRequest,
        key: str,
        *,
        tag: str,
        worker: str,
        ttl_ms: int,
        patience: float,
        replicas: int = 0,
    ) -> tuple[BeginState, str, str, threading.Lock | None]:
        """:func:`begin` for a keyed call: (state, value, holder it began as, key lock
        if it runs)."""
        while True:
            with self._lock:
                lock = self._keys.get(key)
                first = lock is None
                if lock is None:
                    lock = self._keys[key] = threading.Lock()
                    lock.acquire()
            if first:
                try:
                    state, value = begin(
                        client,
                        call,
                        holder=tag,
                        hostname=worker,
                        ttl_ms=ttl_ms,
                        patience=patience,
                        replicas=replicas,
                    )
                except BaseException:
                    self._end(key, lock)
                    raise
                if state != "run":
                    self._end(key, lock)
                    return state, value, tag, None
                lock.release()  # held again by completing() (Admitted.key_lock)
                return state, value, tag, lock
            with lock:  # no begin or complete of the running delivery is under way
                if self._keys.get(key) is lock:
                    joiner = joining_tag(tag)
                    state, value = begin(
                        client,
                        call,
                        holder=joiner,
                        hostname=worker,
                        ttl_ms=ttl_ms,
                        patience=patience,
                        replicas=replicas,
                    )
                    return state, value, joiner, None
            # The delivery running it here has ended meanwhile: begin afresh.

    @contextmanager
    def completing(self, admitted: Admitted) -> Iterator[None]:
        """Hold the key's lock for the block (the complete step), then forget the key."""
        lock, key = admitted.key_lock, admitted.call.idempotency_key
        if lock is None or key is None:
            yield
            return
        lock.acquire()
        try:
            yield
        finally:
            self._end(key, lock)

    def abandon(self, admitted: Admitted) -> None:
        """Forget the key of a delivery that ends without completing (its process stops)."""
        if admitted.key_lock is not None and admitted.call.idempotency_key is not None:
            admitted.key_lock.acquire()
            self._end(admitted.call.idempotency_key, admitted.key_lock)

    def _end(self, key: str, lock: threading.Lock) -> None:
        with self._lock:
            if self._keys.get(key) is lock:
                del self._keys[key]
        lock.release()


#: The keys this process runs.
running_here = RunningHere()

# -- holding on RabbitMQ ---------------------------------------------------------------


def holds_before_ack(settings: Settings, *, acks_late: bool) -> bool:
    """Whether a call of a task that ``acks_late`` or not is recorded before it is acknowledged."""
    return not acks_late and is_amqp_url(settings.broker_url)


def hold(client: redis.Redis, call_id: str, tag: str, *, interval: float) -> bool:
    """Record ``tag`` as the holder of call ``call_id``, as the heartbeat would; whether it was.

    Never raises: a Redis that cannot be reached leaves the call to its heartbeat.
    """
    try:
        client.set(keys.running(call_id), tag, px=int(interval * keys.HELD_MARKER_BEATS * 1000))
    except redis.RedisError as exc:
        logger.warning("could not record the holder of call %s: %s", call_id, type(exc).__name__)
        return False
    return True


def started_before(client: redis.Redis, call_id: str) -> bool:
    """Whether a process was recorded as running call ``call_id`` (a holder with a pid).

    A record without a pid (the heartbeat's, for a call waiting for a pool process) does
    not count. Redis unreachable: False (the call runs, as it would without this look).
    """
    try:
        record = client.get(keys.running(call_id))
    except redis.RedisError as exc:
        logger.warning("could not read the holder of call %s: %s", call_id, type(exc).__name__)
        return False
    return record is not None and parse_holder_tag(record)[1] != 0


def waits_for_hold(accept_callback: Any) -> bool:
    """Whether a pool's ``accept_callback`` writes to Redis before acknowledging (off an
    event loop)."""
    return (
        getattr(getattr(accept_callback, "__self__", None), "toolexec_holds_before_ack", False)
        is True
    )


# -- copies sent again --------------------------------------------------------------

#: How long a copy sent again asks whether it may start while Redis is unreachable.
START_PATIENCE = 10.0


def may_start(
    call: CallRequest, generation: int, *, tag: str, settings: Settings, worker: str
) -> bool:
    """Whether this copy sent again may start (:data:`wire.copies.START`), recording it
    held by ``tag`` if so; a copy the client gave up on, or sent again since, may not.

    Asked again while Redis is unreachable, for as long as a begin would be; then
    :class:`~executor.errors.StoreUnavailable` ends the delivery (the call did not run).
    """
    client = redis_client(settings)
    record_ms = int(settings.heartbeat_interval * keys.HELD_MARKER_BEATS * 1000)
    pauses = retry_pauses(START_PATIENCE)
    while True:
        try:
            answer = START.run(
                client,
                [keys.fence(call.call_id), keys.running(call.call_id)],
                [generation, tag, record_ms],
            )
            break
        except redis.RedisError as exc:
            pause = next(pauses, None)
            if pause is None:
                raise StoreUnavailable(START_PATIENCE, exc) from exc
            time.sleep(pause)
    answer = answer.decode() if isinstance(answer, bytes) else str(answer)
    if answer == "run":
        return True
    logger.info(
        "call %s of %s: this copy does not run: %s",
        call.call_id,
        call.tool,
        "its caller gave the call up"
        if answer == "fenced"
        else "its caller has sent it again since",
        extra=call_log_fields(call.call_id, call.run_id, call.tool),
    )
    return False
