"""The doctor's checks of how long things last: ``ttls``, ``visibility-timeout``, ``persistence``.

* ``ttls``: no ``toolexec:*`` key but the catalog lives without a TTL (a sample of up
  to ``sample`` keys, read with ``SCAN`` and ``TTL``); the TTL settings are positive by
  construction (:class:`~wire.settings.Settings` refuses others);
* ``visibility-timeout``: above every tool's hard limit plus Celery's margin
  (:data:`wire.message.CELERY_LIMIT_MARGIN`), the tools of this worker and
  those in the catalog;
* ``persistence``: Redis keeps an append-only file when idempotent tools are registered
  (their stored outcomes are what stops a repeated booking), read with ``INFO
  persistence`` (``CONFIG GET`` if that is refused);
* ``eviction``: Redis evicts no key when it is full (``maxmemory-policy noeviction``):
  an evicting Redis drops the claims, holder records and heartbeats that keep calls
  from running twice (a worker refuses to start on one);
* ``replica-acks``: with ``TOOLEXEC_REPLICA_ACKS=N``, the Redis of ``TOOLEXEC_REDIS_URL``
  has at least N replicas online (``INFO replication``), which every idempotent call
  waits for before it runs.
"""

from __future__ import annotations

from collections.abc import Iterable

import redis

from toolexec.doctor.check import Check, cannot_read, failed, passed, shown
from wire import keys
from wire.message import CELERY_LIMIT_MARGIN
from wire.models import ToolSpec
from wire.redis_errors import explain
from wire.settings import ENVIRONMENT_VARIABLES, Settings

__all__ = ["eviction", "persistence", "replica_acks", "ttls", "visibility_timeout"]

#: Keys under ``toolexec:`` that live without a TTL by design.
_NO_TTL = frozenset({keys.CATALOG, keys.WORKERS})


# -- ttls --------------------------------------------------------------------------------


def ttls(settings: Settings, client: redis.Redis, sample: int) -> Check:
    """The ttls check, over at most ``sample`` ``toolexec:*`` keys."""
    # The TTL settings themselves are positive: Settings refuses anything else.
    set_to = ", ".join(
        f"{ENVIRONMENT_VARIABLES[name]}={getattr(settings, name):g}s"
        for name in ("reply_ttl", "outcome_ttl")
    )
    try:
        names: list[bytes] = []
        for name in client.scan_iter(match=f"{keys.PREFIX}*", count=1000):
            names.append(name)
            if len(names) >= sample:
                break
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.ttl(name)
        found = pipe.execute()
    except redis.RedisError as exc:
        return cannot_read("ttls", f"Redis at {shown(settings.redis_url)}", explain(exc))
    forever = sorted(
        text
        for name, ttl in zip(names, found, strict=True)
        if ttl == -1 and (text := name.decode(errors="replace")) not in _NO_TTL
    )
    looked = f"{len(names)} toolexec keys looked at" + (
        f" (a sample of {sample})" if len(names) >= sample else ""
    )
    if forever:
        listed = ", ".join(forever[:5]) + (
            f" and {len(forever) - 5} more" if len(forever) > 5 else ""
        )
        return failed(
            "ttls",
            f"{len(forever)} of {looked} have no TTL: {listed}",
            fix="every toolexec key but the catalog expires: these were written by something else "
            "(an older version, a script); EXPIRE or DEL them",
        )
    return passed("ttls", f"{set_to}; {looked}, none without a TTL but the catalog")


# -- visibility-timeout ----------------------------------------------------------------------


def visibility_timeout(settings: Settings, specs: Iterable[ToolSpec]) -> Check:
    """The visibility-timeout check, against the hard limits of ``specs``."""
    # Celery's hard limit is the tool's plus CELERY_LIMIT_MARGIN: the message stays
    # unacknowledged until that one has passed.
    limit = settings.visibility_timeout
    over = sorted(
        (spec.name, spec.hard_timeout)
        for spec in specs
        if spec.hard_timeout is not None and spec.hard_timeout + CELERY_LIMIT_MARGIN >= limit
    )
    if over:
        listed = ", ".join(
            f"{name} ({hard:g}s, Celery's limit {hard + CELERY_LIMIT_MARGIN:g}s)"
            for name, hard in over
        )
        longest = max(hard for _, hard in over) + CELERY_LIMIT_MARGIN
        return failed(
            "visibility-timeout",
            f"TOOLEXEC_VISIBILITY_TIMEOUT is {limit}s; hard limits that reach it: {listed}",
            fix=(
                f"set TOOLEXEC_VISIBILITY_TIMEOUT above {longest:g}, or Redis redelivers calls "
                "that are still running (with ack emulation)"
            ),
        )
    return passed(
        "visibility-timeout",
        f"{limit}s, above every tool's hard limit plus Celery's {CELERY_LIMIT_MARGIN:g}s margin",
    )


# -- persistence -------------------------------------------------------------------------


def persistence(client: redis.Redis, specs: Iterable[ToolSpec], catalog_error: str) -> Check:
    """The persistence check, for the idempotent tools among ``specs``.

    ``catalog_error`` says why the catalog could not be read (empty when it was).
    """
    idempotent = sorted(spec.name for spec in specs if spec.idempotent)
    if not idempotent:
        if catalog_error:
            return cannot_read("persistence", "the catalog", catalog_error)
        return passed("persistence", "no idempotent tools registered: nothing to keep")
    tools = ", ".join(idempotent)
    try:
        aof = _append_only(client)
    except redis.RedisError as exc:
        return failed(
            "persistence",
            f"idempotent tools ({tools}) are registered, and Redis does not say whether it keeps "
            f"an append-only file: {explain(exc)}",
            fix=(
                "run the doctor as a Redis user allowed CONFIG GET or INFO, or check that the "
                "server runs with appendonly yes"
            ),
        )
    if not aof:
        return failed(
            "persistence",
            f"idempotent tools ({tools}) are registered, and Redis keeps no append-only file: a "
            "restart forgets the stored outcomes that stop a repeated call from running again",
            fix=(
                "run Redis with appendonly yes (appendfsync everysec or always); in "
                "docker-compose, command: redis-server --appendonly yes, with a volume for /data"
            ),
        )
    return passed("persistence", f"append-only file on; idempotent tools: {tools}")


def _append_only(client: redis.Redis) -> bool:
    # INFO persistence first: the documented ACL allows it (+info|persistence), and so do
    # managed Redis services that refuse CONFIG. An admin user may have CONFIG only.
    try:
        info = client.info("persistence")
        return str(info.get("aof_enabled", 0)) == "1"
    except redis.ResponseError:
        value = client.config_get("appendonly").get("appendonly")
        return str(value.decode() if isinstance(value, bytes) else value).lower() == "yes"


# -- eviction -----------------------------------------------------------------------------


def eviction(settings: Settings, client: redis.Redis) -> Check:
    """The eviction check: ``maxmemory-policy`` is ``noeviction``."""
    from executor.seams.lockdown import KEEPS_KEYS, eviction_policy  # the worker's own rule

    where = f"Redis at {shown(settings.redis_url)}"
    try:
        policy = eviction_policy(client)
    except redis.RedisError as exc:
        return cannot_read("eviction", f"the maxmemory-policy of {where}", explain(exc))
    if policy != KEEPS_KEYS:
        return failed(
            "eviction",
            f"{where} evicts keys when it is full (maxmemory-policy {policy}): the claims, holder "
            "records and heartbeats that keep calls from running twice would be dropped, and "
            "workers refuse to start",
            fix=(
                f"CONFIG SET maxmemory-policy {KEEPS_KEYS} (and maxmemory-policy {KEEPS_KEYS} in "
                "redis.conf)"
            ),
        )
    return passed(
        "eviction", f"maxmemory-policy {KEEPS_KEYS}: a full Redis refuses writes and evicts nothing"
    )


# -- replica-acks ------------------------------------------------------------------------


def replica_acks(settings: Settings, client: redis.Redis) -> Check:
    """The replica-acks check: the store's master has the replicas
    ``TOOLEXEC_REPLICA_ACKS`` waits for, online."""
    wanted = settings.replica_acks
    if not wanted:
        return passed(
            "replica-acks",
            "TOOLEXEC_REPLICA_ACKS is 0: no write waits for a replica (a failover may lose "
            "the writes a replica had not received: docs/deploy.md)",
        )
    where = f"Redis at {shown(settings.redis_url)}"
    try:
        replication = client.info("replication")
    except redis.RedisError as exc:
        return cannot_read("replica-acks", f"the replication of {where}", explain(exc))
    online = [
        value
        for name, value in replication.items()
        if name.startswith("slave") and isinstance(value, dict) and value.get("state") == "online"
    ]
    if len(online) < wanted:
        return failed(
            "replica-acks",
            f"{where} has {len(online)} replica(s) online; TOOLEXEC_REPLICA_ACKS={wanted} has "
            "every idempotent call wait for that many before it runs, so none runs: each "
            "ends at its deadline",
            fix=(
                f"attach {wanted - len(online)} more replica(s) to it (a Sentinel group that is "
                f"to serve on after losing its master needs {wanted + 1}), or lower "
                "TOOLEXEC_REPLICA_ACKS"
            ),
        )
    return passed(
        "replica-acks",
        f"{where} has {len(online)} replica(s) online; an idempotent call runs once "
        f"{wanted} have its start, and its stored outcome is waited for on as many",
    )
