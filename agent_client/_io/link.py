"""One connection to one Redis server, and what became of each command sent on it.

A :class:`Link` runs one batch of commands at a time, as a pipeline bounded by a
timeout, and tells, for each command, whether Redis answered it, refused it
(:class:`Refused`: it did not run), or whether its fate is unknown (:class:`Unknown`: the
connection failed after the command may have been written). :class:`NotSent` means that
nothing was written at all: the connection could not be made. A Lua script the server
has forgotten (after a restart) is loaded and its runs sent again by the link itself, the
one way :mod:`wire.scripts` says: callers only spell each run with ``LuaScript.command``.

Links live on the client's I/O thread (:mod:`agent_client._io.loop`), which closes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis
import redis.asyncio
import redis.asyncio.sentinel
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from wire.connect import async_pool, close_sentinels, sentinel_connections, sentinel_group
from wire.resp import Arg, pack
from wire.scripts import is_noscript, reloading


class NotSent(Exception):
    """Nothing of a batch was written: the connection could not be made in time."""


@dataclass(frozen=True, slots=True)
class Refused:
    """Redis answered a command with an error: the command did not run."""

    error: Exception


@dataclass(frozen=True, slots=True)
class Unknown:
    """The connection failed after a command may have been written: it may have run."""

    error: BaseException


#: Refusals after which a command can be sent again: the server was not ready for it.
#: (Not ``NOSCRIPT``: the link has loaded the script and sent the run again already.)
_TRANSIENT_ERRORS = (
    redis.exceptions.BusyLoadingError,
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.MasterDownError,
)
#: The same, for the codes redis-py has no class for.
_TRANSIENT_CODES = ("BUSY ", "MISCONF ")


#: Pauses between attempts while a server cannot be reached: the first, and the most
#: (each doubles the last). The one schedule of every retry on the client's I/O thread.
BACKOFF_FIRST, BACKOFF_MAX = 0.05, 0.5


def backoff_after(pause: float) -> float:
    """The pause after ``pause`` (0: the first failure) while a server cannot be reached:
    :data:`BACKOFF_FIRST`, doubling up to :data:`BACKOFF_MAX`."""
    return min(max(pause * 2, BACKOFF_FIRST), BACKOFF_MAX)


def is_transient(refusal: Refused) -> bool:
    """Whether a refused command may succeed if sent again (the server was not ready)."""
    return isinstance(refusal.error, _TRANSIENT_ERRORS) or str(refusal.error).startswith(
        _TRANSIENT_CODES
    )


class Link:
    """One connection to one Redis server, used by one batch at a time.

    Args:
        url: The server's URL, or its Sentinels' (``wire.connect``): each connection
            then asks them for the master as it connects.
        master: The group a ``sentinel://`` URL names.
    """

    def __init__(self, url: str, *, master: str | None = None) -> None:
        group = sentinel_group(url, master)
        tls: dict[str, Any] = {}
        if url.startswith("rediss://"):
            tls = {"connection_class": _TLSConnection}
        elif group is not None and group.tls is not None:
            tls = {"connection_class": _SentinelTLSConnection}
        self._pool = async_pool(
            url,
            master=master,
            socket_connect_timeout=None,
            socket_timeout=None,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
            **tls,
        )
        self._tls = bool(tls)
        self._cut_short = (
            False  # a TLS connect was cancelled or timed out (close() says why it matters)
        )
        self._conn: Any = None
        #: A connection being opened (its handshake under way): a fork at that moment
        #: leaves the child a copy of its socket too (:meth:`forget`).
        self._opening: Any = None
        self._lock = asyncio.Lock()

    async def connect(self, *, timeout: float) -> None:
        """Make sure the connection is up, writing nothing.

        Raises:
            NotSent: No connection within ``timeout``.
        """
        ends = asyncio.get_running_loop().time() + timeout
        await self._acquire(ends)
        try:
            await self._connect(ends)
        finally:
            self._lock.release()

    async def _acquire(self, ends: float) -> None:
        if not self._lock.locked():  # free: taken at once, with no timer to set up
            await self._lock.acquire()
            return
        try:
            async with asyncio.timeout_at(ends):
                await self._lock.acquire()
        except TimeoutError as exc:
            raise NotSent("the connection was busy until the deadline") from exc

    async def execute(self, commands: Sequence[Sequence[Arg]], *, timeout: float) -> list[Any]:
        """Send ``commands`` as one pipeline; each reply, or :class:`Refused`, :class:`Unknown`.

        Entries that ran a script the server had forgotten are sent again after it is
        loaded (:func:`wire.scripts.reloading`), in a second round trip within the
        same ``timeout``; their replies are those of the second one.

        Raises:
            NotSent: Nothing was written: no connection within ``timeout``.
        """
        ends = asyncio.get_running_loop().time() + timeout
        await self._acquire(ends)
        try:
            conn = await self._connect(ends)
            replies, forgotten = await self._exchange(conn, commands, ends)
            if forgotten:
                await self._reload(commands, replies, forgotten, ends)
            return replies
        finally:
            self._lock.release()

    async def _reload(
        self,
        commands: Sequence[Sequence[Arg]],
        replies: list[Any],
        forgotten: list[int],
        ends: float,
    ) -> None:
        # The forgotten entries did not run: load their scripts and send them again. If
        # no connection comes, they stay refused as NOSCRIPT (they still did not run).
        try:
            conn = await self._connect(ends)
        except NotSent:
            return
        again, _ = await self._exchange(conn, reloading(commands, forgotten), ends)
        for i, reply in zip(forgotten, again[len(again) - len(forgotten) :], strict=True):
            replies[i] = reply

    async def _connect(self, ends: float) -> Any:
        conn = self._conn
        if conn is not None and await _usable(conn):
            return conn
        if conn is not None:
            await self._drop()
        conn = cast(Any, self._pool).make_connection()  # redis-py leaves it untyped
        conn.redis_connect_func = _handshake
        self._opening = conn
        try:
            async with asyncio.timeout_at(ends):
                await conn.connect()
        except (TimeoutError, redis.RedisError, OSError) as exc:
            self._cut_short = self._tls
            _abort(conn)
            with contextlib.suppress(Exception):
                await conn.disconnect(nowait=True)
            raise NotSent(_describe(exc)) from exc
        except asyncio.CancelledError:
            self._cut_short = self._tls
            _abort(conn)
            raise
        finally:
            self._opening = None
        self._conn = conn
        return conn

    async def _exchange(
        self, conn: Any, commands: Sequence[Sequence[Arg]], ends: float
    ) -> tuple[list[Any], list[int]]:
        # The replies, and which of them are NOSCRIPT refusals (noted here, where a
        # refusal is read, so that a pipeline that ran nothing forgotten costs no scan).
        replies: list[Any] = []
        forgotten: list[int] = []
        try:
            async with asyncio.timeout_at(ends):
                await conn.send_packed_command(pack(commands), check_health=False)
                for _ in commands:
                    try:
                        replies.append(await conn.read_response(disconnect_on_error=False))
                    except (
                        redis.exceptions.ResponseError,
                        redis.exceptions.BusyLoadingError,
                    ) as exc:
                        if is_noscript(exc):
                            forgotten.append(len(replies))
                        replies.append(Refused(exc))
        except (TimeoutError, redis.RedisError, OSError) as exc:
            await self._drop()
            unknown = Unknown(exc)
            replies.extend(unknown for _ in range(len(commands) - len(replies)))
        except BaseException:
            await self._drop()
            raise
        return replies, forgotten

    async def _drop(self) -> None:
        # The connection is given up, and with it what asyncio still buffers for it: an
        # abort, as a close would keep the socket open until a frozen server read that.
        conn, self._conn = self._conn, None
        if conn is None:
            return
        _abort(conn)
        with contextlib.suppress(Exception):
            await conn.disconnect(nowait=True)

    async def close(self) -> None:
        """Close the connection (and any to its Sentinels); its socket is closed when this
        returns."""
        await self._drop()
        await close_sentinels(self._pool)
        if self._cut_short:
            # A TLS connect cut short just as its handshake completed is closed by asyncio
            # itself, out of reach (create_connection never returned its transport), and
            # gracefully: TLS's goodbye waits for the server's, at most _TLS_GOODBYE
            # (_TLSConnection). The loop must run that long, or a loop closed now leaves
            # the socket open. Only a connect cut short pays this wait.
            self._cut_short = False
            await asyncio.sleep(_TLS_GOODBYE)
        await asyncio.sleep(0)  # the transport closes its socket on the loop's next turn

    def forget(self) -> None:
        """In a forked child: close this process's copy of each socket, and nothing else:
        the connection's, one the parent was opening as it forked, and those to its
        Sentinels (a ``sentinel://`` URL).

        The sockets are the parent's too: nothing is written on them or shut down, and the
        loop is not asked to unregister them (its epoll set is the parent's as well).
        """
        # The objects stay referenced (the run is kept, see loop._forget): collected, the
        # stream writer would close its transport, unregistering it from the shared set.
        for conn in (self._conn, self._opening, *sentinel_connections(self._pool)):
            transport = _transport(conn) if conn is not None else None
            if transport is not None:
                # asyncio hands out its socket wrapped, without close(): close the one inside.
                wrapped = transport.get_extra_info("socket")
                sock = getattr(wrapped, "_sock", wrapped)
                if isinstance(sock, socket.socket):
                    sock.close()


async def _handshake(conn: Any) -> None:
    # redis-py's own handshake (AUTH, HELLO, SELECT), except that a refusal or a cancel
    # aborts the socket: redis-py closes it (and forgets it) first, and a TLS close waits
    # for the server's goodbye, past the end of a client that is closing, so that the
    # collector finds it open. The transport is taken before redis-py can forget it.
    transport = _transport(conn)
    try:
        await conn.on_connect()
    except BaseException:
        if transport is not None:
            transport.abort()
        raise


#: Seconds a TLS connection's goodbye waits for the server's before its socket is closed
#: anyway (asyncio's ``ssl_shutdown_timeout``, 30 s by default: a closing client's loop
#: does not run that long).
_TLS_GOODBYE = 0.1


class _TLSConnection(redis.asyncio.SSLConnection):
    """redis-py's TLS connection, whose goodbye waits at most :data:`_TLS_GOODBYE`."""

    def _connection_arguments(self) -> Mapping[str, Any]:
        return {**super()._connection_arguments(), "ssl_shutdown_timeout": _TLS_GOODBYE}


class _SentinelTLSConnection(redis.asyncio.sentinel.SentinelManagedSSLConnection):
    """redis-py's TLS connection to a Sentinel-managed master, whose goodbye waits at most
    :data:`_TLS_GOODBYE`, as :class:`_TLSConnection`'s."""

    def _connection_arguments(self) -> Mapping[str, Any]:
        return {**super()._connection_arguments(), "ssl_shutdown_timeout": _TLS_GOODBYE}


def _abort(conn: Any) -> None:
    transport = _transport(conn)
    if transport is not None:
        transport.abort()


def _transport(conn: Any) -> asyncio.Transport | None:
    # redis-py keeps the stream writer of an open connection, and the writer its transport.
    writer = getattr(conn, "_writer", None)
    transport = getattr(writer, "transport", None)
    return transport if isinstance(transport, asyncio.Transport) else None


async def _usable(conn: Any) -> bool:
    # A connection whose server closed it (a restart) is made again before anything is
    # written on it, so that a batch sent on it is not counted as "maybe delivered".
    if not conn.is_connected:
        return False
    writer = getattr(conn, "_writer", None)
    if writer is not None and writer.is_closing():
        return False
    try:
        return not await conn.can_read()
    except (redis.RedisError, OSError):
        return False


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError) and not str(exc):
        return "timed out"
    return str(exc) or type(exc).__name__
