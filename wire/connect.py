"""How a Redis URL becomes a client, for every side: a server's own URL, or Sentinel's.

``TOOLEXEC_BROKER_URL`` and ``TOOLEXEC_REDIS_URL`` each name a Redis server (``redis://``,
``rediss://``, ``unix://``) or the Sentinels that know which server is the master of a
group, in kombu's form, one ``sentinel://`` URL per Sentinel joined by ``;``::

    sentinel://:secret@h1:26379;sentinel://h2:26379;sentinel://h3:26379/0

with the group's name in ``TOOLEXEC_SENTINEL_MASTER``. TLS, to the Sentinels and to the
master alike (Sentinel's ``tls-replication yes``), takes a ``rediss://`` URL's parameters at
the end: ``...;sentinel://h3:26379/0?ssl_cert_reqs=required&ssl_ca_certs=/etc/ca.pem``
(``ssl_certfile`` and ``ssl_keyfile`` for a client certificate). As with kombu (whose Sentinel
transport a worker's broker runs on), the first URL's user, password and database are
the master's; the Sentinels are asked without a password. A client made here asks the
Sentinels for the master when it connects, and again after its connection breaks or
the server it reached says it is no longer the master: a failover is an outage like any
other, and whoever holds the client connects again to the new master unattended.

Every Redis client of the project is made by :func:`sync_client` or :func:`async_pool`
(a test parses the tree for any other ``from_url``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel

from wire.resp import PACKER
from wire.urls import SENTINEL_SCHEME, is_sentinel_url

__all__ = [
    "SentinelGroup",
    "async_pool",
    "close_sentinels",
    "sentinel_connections",
    "sentinel_group",
    "kombu_url",
    "sync_client",
]

#: The port of a Sentinel whose URL names none (Redis's own default for Sentinels).
SENTINEL_PORT = 26379


@dataclass(frozen=True, kw_only=True)
class SentinelGroup:
    """A Redis group managed by Sentinels, as a ``sentinel://`` URL and its master's name.

    Attributes:
        sentinels: Each Sentinel's host and port, in the URL's order.
        master: The group's name (``TOOLEXEC_SENTINEL_MASTER``).
        db: The master's database number.
        username: The master's user name, if any.
        password: The master's password, if any.
        tls: redis-py's TLS options (``ssl_cert_reqs``, ``ssl_ca_certs``, ...) of the
            Sentinels and the master, from the URL's parameters; None: no TLS.
    """

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: dict[str, str] | None = None

    def connection_options(self) -> dict[str, Any]:
        """The master's connection options: its database, credentials and TLS."""
        options: dict[str, Any] = {"db": self.db, **self.tls_options()}
        if self.username:
            options["username"] = self.username
        if self.password:
            options["password"] = self.password
        return options

    def sentinel_options(self) -> dict[str, Any]:
        """redis-py's keyword arguments of a connection to one of the Sentinels: bounded
        (:data:`SENTINEL_TIMEOUT`), with TLS if the group has it."""
        return {**_socket_options({}), **self.tls_options()}

    def tls_options(self) -> dict[str, Any]:
        """redis-py's keyword arguments of a TLS connection to the group; none without TLS."""
        return {"ssl": True, **self.tls} if self.tls is not None else {}


def sentinel_group(url: str, master: str | None) -> SentinelGroup | None:
    """The group a ``sentinel://`` URL names, or None for a server's own URL.

    Raises:
        ValueError: The URL names no Sentinel, one of its parts is malformed, it ends
            with a parameter other than TLS's, or ``master`` is missing.
    """
    if not is_sentinel_url(url):
        return None
    if not master:
        raise ValueError(
            "a sentinel:// URL needs the name of its master group (TOOLEXEC_SENTINEL_MASTER)"
        )
    base, _, query = url.partition("?")
    sentinels: list[tuple[str, int]] = []
    db, username, password = 0, None, None
    for i, part in enumerate(p.strip() for p in base.split(";")):
        if not part:
            continue
        if not part.startswith(SENTINEL_SCHEME):
            raise ValueError(
                f"each part of a Sentinel URL must start with {SENTINEL_SCHEME} (part {i + 1})"
            )
        parts = urlsplit(part)
        try:
            port = parts.port or SENTINEL_PORT
        except ValueError:
            raise ValueError(f"part {i + 1} of the Sentinel URL has a port that is not a number")
        if not parts.hostname:
            raise ValueError(f"part {i + 1} of the Sentinel URL names no host")
        sentinels.append((parts.hostname, port))
        path = parts.path.strip("/")
        if path and not path.isdigit():
            raise ValueError(f"the Sentinel URL's database must be a number, not {path!r}")
        if i == 0:
            username = unquote(parts.username) if parts.username else None
            password = unquote(parts.password) if parts.password else None
            db = int(path) if path else 0
        elif (parts.username or parts.password) and (
            unquote(parts.username or "") != (username or "")
            or unquote(parts.password or "") != (password or "")
        ):
            raise ValueError(
                "the Sentinel URL's user and password go on its first part (or the same on "
                "every part): they are the master's"
            )
        elif path and int(path) != db:
            # kombu (the workers' broker) reads the database of the first URL only.
            raise ValueError(
                f"the Sentinel URL's database goes on its first part, as kombu reads it: "
                f"sentinel://host:port/{path};sentinel://..."
            )
    return SentinelGroup(
        sentinels=tuple(sentinels),
        master=master,
        db=db,
        username=username,
        password=password,
        tls=_tls(query),
    )


#: The parameters a ``sentinel://`` URL may end with (after its last part): TLS to its
#: Sentinels and to the master, as a ``rediss://`` URL takes them.
TLS_PARAMETERS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
#: What ``ssl_cert_reqs`` may say.
CERT_REQS = ("required", "optional", "none")


def _tls(query: str) -> dict[str, str] | None:
    """redis-py's TLS options of a ``sentinel://`` URL's parameters; None without any."""
    given = {name: values[-1] for name, values in parse_qs(query, keep_blank_values=True).items()}
    unknown = sorted(set(given) - set(TLS_PARAMETERS))
    if unknown:
        raise ValueError(
            f"a sentinel:// URL takes no parameter {', '.join(unknown)}; it takes "
            f"{', '.join(TLS_PARAMETERS)} (TLS to the Sentinels and the master)"
        )
    if not given:
        return None
    reqs = given.get("ssl_cert_reqs", "required").lower()
    if reqs not in CERT_REQS:
        raise ValueError(f"ssl_cert_reqs must be one of {', '.join(CERT_REQS)}, not {reqs!r}")
    return {**given, "ssl_cert_reqs": reqs}


def kombu_url(url: str) -> str:
    """A ``sentinel://`` URL as kombu is to read it (a worker's broker): without its TLS
    parameters, which kombu takes from ``broker_use_ssl``, and with the first part's user
    and password on every part. kombu, trying the next Sentinel after a refused connection,
    reads that part's own credentials: without them it would ask the master without AUTH.
    """
    parts = [part.strip() for part in url.partition("?")[0].split(";") if part.strip()]
    userinfo = urlsplit(parts[0]).netloc.rpartition("@")[0]
    if not userinfo:
        return ";".join(parts)
    same = [parts[0]]
    for part in parts[1:]:
        split = urlsplit(part)
        same.append(split._replace(netloc=f"{userinfo}@{split.netloc.rpartition('@')[2]}").geturl())
    return ";".join(same)


def sync_client(url: str, *, master: str | None = None, **options: Any) -> redis.Redis:
    """A blocking client of the Redis ``url`` names (its master, for a ``sentinel://`` URL).

    Args:
        url: A server's URL, or a ``sentinel://`` URL.
        master: The group's name, for a ``sentinel://`` URL.
        **options: redis-py's connection options (timeouts, health checks, ...); the
            Sentinels are asked with the same socket timeouts.
    """
    options.setdefault("command_packer", PACKER)  # wire.resp: hiredis, redis-py's bytes
    group = sentinel_group(url, master)
    if group is None:
        return redis.Redis.from_url(url, **options)
    sentinels = redis.sentinel.Sentinel(
        list(group.sentinels),
        sentinel_kwargs={**_socket_options(options), **group.tls_options()},
        **group.connection_options(),
        **options,
    )
    client: redis.Redis = sentinels.master_for(group.master, redis_class=_SentinelManaged)
    return client


class _SentinelManaged(redis.Redis):
    """A client of a group's master that closes its connections to the Sentinels too."""

    def close(self) -> None:
        super().close()
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):
            sentinel.close()


def async_pool(
    url: str, *, master: str | None = None, **options: Any
) -> redis.asyncio.ConnectionPool:
    """An asyncio connection pool of the Redis ``url`` names; for a ``sentinel://`` URL,
    a pool whose connections ask the Sentinels for the master as each one connects.

    Args:
        url: A server's URL, or a ``sentinel://`` URL.
        master: The group's name, for a ``sentinel://`` URL.
        **options: redis-py's connection options.
    """
    group = sentinel_group(url, master)
    if group is None:
        return redis.asyncio.ConnectionPool.from_url(url, **options)
    sentinels = redis.asyncio.sentinel.Sentinel(
        list(group.sentinels),
        sentinel_kwargs={**_socket_options(options), **group.tls_options()},
        **group.connection_options(),
        **options,
    )
    pool: redis.asyncio.ConnectionPool = sentinels.master_for(group.master).connection_pool
    return pool


#: Seconds a Sentinel may take to connect or answer (less if the caller's bound is less):
#: one that is down or frozen must not hold up the look at the next.
SENTINEL_TIMEOUT = 1.0


def sentinel_connections(pool: redis.asyncio.ConnectionPool) -> list[Any]:
    """The connections :func:`async_pool`'s pool has made to the Sentinels so far (none
    for a server's own URL), idle and in use alike."""
    manager = getattr(pool, "sentinel_manager", None)
    found: list[Any] = []
    for sentinel in getattr(manager, "sentinels", ()):
        sentinels_pool = sentinel.connection_pool
        found += [
            *getattr(sentinels_pool, "_available_connections", ()),
            *getattr(sentinels_pool, "_in_use_connections", ()),
        ]
    return found


async def close_sentinels(pool: redis.asyncio.ConnectionPool) -> None:
    """Close the connections :func:`async_pool`'s pool made to the Sentinels (none for a
    server's own URL); the pool's own connections are its holder's to close."""
    manager = getattr(pool, "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", ()):
        await sentinel.aclose()


def _socket_options(options: dict[str, Any]) -> dict[str, Any]:
    # How long a Sentinel may take to answer: as long as the master may, and bounded.
    bounded = {"socket_timeout": SENTINEL_TIMEOUT, "socket_connect_timeout": SENTINEL_TIMEOUT}
    for name in bounded:
        if options.get(name) is not None:
            bounded[name] = min(options[name], SENTINEL_TIMEOUT)
    return bounded
