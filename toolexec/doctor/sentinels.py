"""The doctor's check of a Redis group that fails over: ``sentinels``.

For each ``sentinel://`` URL of the settings (the broker's, the Redis's; once when they
are the same), every Sentinel it lists is asked ``SENTINEL MASTER`` and ``SENTINEL
REPLICAS`` of ``TOOLEXEC_SENTINEL_MASTER``. It passes when every Sentinel answers, they
all name the same master and none takes it for down, and at least one replica is up: a
failover can then happen, and has somewhere to go. Without a ``sentinel://`` URL it
passes, saying that each role is one server.
"""

from __future__ import annotations

import collections
from typing import Any

import redis

from toolexec.doctor.check import Check, failed, passed
from wire.connect import SentinelGroup, sentinel_group
from wire.redis_errors import explain
from wire.settings import Settings
from wire.urls import is_sentinel_url

__all__ = ["sentinels"]


def sentinels(settings: Settings) -> Check:
    """The sentinels check."""
    roles: dict[str, list[str]] = {}
    for variable, url in (
        ("TOOLEXEC_BROKER_URL", settings.broker_url),
        ("TOOLEXEC_REDIS_URL", settings.redis_url),
    ):
        if is_sentinel_url(url):
            roles.setdefault(url, []).append(variable)
    if not roles:
        return passed(
            "sentinels",
            "no sentinel:// URL: each role is one Redis server, and an outage of it lasts "
            "until it is back",
        )
    found: list[str] = []
    problems: list[str] = []
    for url, variables in roles.items():
        group = sentinel_group(url, settings.sentinel_master)
        assert group is not None  # a sentinel:// URL, checked by Settings
        seen, trouble = _look(group)
        named = " and ".join(variables)
        found.append(f"{named}: {seen}")
        problems.extend(f"{named}: {problem}" for problem in trouble)
    if problems:
        return failed(
            "sentinels",
            "; ".join(problems),
            "bring back the Sentinels and replicas named (or list the Sentinels that watch "
            "the group, with the group's name in TOOLEXEC_SENTINEL_MASTER): a failover needs "
            "a quorum of Sentinels that agree, and a replica to promote",
        )
    return passed("sentinels", "; ".join(found))


def _look(group: SentinelGroup) -> tuple[str, list[str]]:
    """What the Sentinels of ``group`` say, and what is wrong with it."""
    masters: dict[tuple[str, int], dict[str, Any]] = {}
    replicas: dict[tuple[str, int], list[dict[str, Any]]] = {}
    trouble = []
    for host, port in group.sentinels:
        try:
            with redis.Redis(host=host, port=port, **group.sentinel_options()) as sentinel:
                masters[(host, port)] = sentinel.sentinel_master(group.master)
                replicas[(host, port)] = sentinel.sentinel_slaves(group.master)
        except redis.RedisError as exc:
            trouble.append(f"the Sentinel at {host}:{port} does not answer ({explain(exc)})")
    if not masters:
        return "no Sentinel answers", trouble
    named = collections.Counter(f"{m['ip']}:{m['port']}" for m in masters.values())
    master, votes = named.most_common(1)[0]
    if len(named) > 1:
        trouble.append(f"the Sentinels name different masters: {dict(named)}")
    down = [f"{h}:{p}" for (h, p), m in masters.items() if m.get("is_sdown") or m.get("is_odown")]
    if down:
        trouble.append(f"the Sentinels at {', '.join(down)} take the master {master} for down")
    up = {
        f"{r['ip']}:{r['port']}"
        for seen in replicas.values()
        for r in seen
        if not (r.get("is_sdown") or r.get("is_odown") or r.get("is_disconnected"))
    }
    if not up:
        trouble.append(f"no replica of {master} is up: a failover has nowhere to go")
    quorum = next(iter(masters.values())).get("quorum", "?")
    seen = (
        f"{len(masters)} of {len(group.sentinels)} Sentinels answer (quorum {quorum}); "
        f"{votes} name the master {master} of {group.master!r}; {len(up)} replica(s) up"
    )
    return seen, trouble
