"""The link's TLS connections bound their goodbye through redis-py's own connect.

``agent_client._io.link._TLSConnection`` adds ``ssl_shutdown_timeout`` to the arguments
redis-py's connect hands ``asyncio.open_connection``: the one hook between them. If
redis-py stops building its connect from ``_connection_arguments``, the bound is lost
silently, so these fail first.
"""

from __future__ import annotations

import inspect

import redis.asyncio

from agent_client._io import link


def test_a_tls_url_gets_the_connection_whose_goodbye_is_bounded_and_a_plain_one_does_not() -> None:
    tls = link.Link("rediss://127.0.0.1:6390/0")
    plain = link.Link("redis://127.0.0.1:6390/0")

    made = tls._pool.make_connection()  # type: ignore[attr-defined]
    assert isinstance(made, link._TLSConnection)
    arguments = made._connection_arguments()
    assert arguments["ssl_shutdown_timeout"] == link._TLS_GOODBYE
    assert arguments["ssl"] is not None and arguments["port"] == 6390
    assert type(plain._pool.make_connection()) is redis.asyncio.Connection  # type: ignore[attr-defined]


def test_redis_pys_connect_still_opens_its_stream_from_connection_arguments() -> None:
    source = inspect.getsource(redis.asyncio.Connection._connect)
    assert "open_connection(" in source and "**self._connection_arguments()" in source
    assert "_connection_arguments" in redis.asyncio.SSLConnection.__dict__
