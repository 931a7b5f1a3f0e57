"""The floor: a minimal hand-written RPC over Redis lists (LPUSH request, BRPOP reply).

``python -m bench.redis_rpc URL`` runs the server: one process that pops a request,
pushes an empty reply and loops. :class:`RpcClient` is the caller, one call at a time;
:class:`AsyncRpcClient` keeps many in flight on one event loop, one reply list for all
of them, read by one task. Nothing is validated, encoded beyond JSON or timed out on
the server: no real system can be cheaper than this on the same Redis.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from typing import cast

import redis
import redis.asyncio

from bench import names

__all__ = ["AsyncRpcClient", "RpcClient", "RpcTimeout", "serve"]

#: Replies the async client's reader takes from its list in one BLMPOP, at most.
_READ_BATCH = 1000
#: Seconds a read of the reply reader may take (it blocks 1 s at a time).
_READ_PATIENCE = 30.0


class RpcTimeout(Exception):
    """No reply came within the timeout."""


class RpcClient:
    """Calls the hand-written RPC server; one reply list per client."""

    def __init__(self, url: str) -> None:
        self._redis = redis.Redis.from_url(url)
        self._reply = names.rpc_reply(uuid.uuid4().hex)

    def call(self, timeout: float = 10.0) -> object:
        """Send one request and block until its reply, at most ``timeout`` seconds.

        A reply to an earlier request that timed out (the readiness check's, sent before
        the server ran) is read and dropped: each call waits for its own.
        """
        call_id = uuid.uuid4().hex
        self._redis.lpush(names.RPC_REQUESTS, json.dumps({"id": call_id, "reply": self._reply}))
        ends = time.monotonic() + timeout
        while (left := ends - time.monotonic()) > 0:
            item = self._redis.brpop([self._reply], timeout=left)
            if item is None:
                break
            reply = json.loads(item[1])
            if reply["id"] == call_id:
                return reply["result"]
        raise RpcTimeout(f"no reply from the RPC server within {timeout}s")

    def close(self) -> None:
        """Close the connection pool."""
        self._redis.close()


class AsyncRpcClient:
    """Calls the RPC server from one event loop: LPUSH per call, one reader for replies.

    Two connections whatever the calls in flight: one sends (the calls take turns on
    it), one reads; the reader pops every waiting reply at once (``BLMPOP ... COUNT``)
    and hands each to its caller by id. Use it on one loop only, and :meth:`aclose` it
    there.
    """

    def __init__(self, url: str) -> None:
        self._send = redis.asyncio.Redis.from_url(url, single_connection_client=True)
        # The reader blocks a second at a time: its reads may take that long and more on
        # a loaded machine, and a read timed out would end the reader.
        self._receive = redis.asyncio.Redis.from_url(
            url, single_connection_client=True, socket_timeout=_READ_PATIENCE
        )
        self._reply = names.rpc_reply(uuid.uuid4().hex)
        self._waiting: dict[str, asyncio.Future[object]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def call(self, timeout: float = 10.0) -> object:
        """Send one request and wait for its reply, at most ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        if self._reader is None:
            self._reader = loop.create_task(self._read())
        call_id = uuid.uuid4().hex
        future: asyncio.Future[object] = loop.create_future()
        self._waiting[call_id] = future
        try:
            request = json.dumps({"id": call_id, "reply": self._reply})
            await self._send.lpush(names.RPC_REQUESTS, request)
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise RpcTimeout(f"no reply from the RPC server within {timeout}s") from None
        finally:
            self._waiting.pop(call_id, None)

    async def _read(self) -> None:
        try:
            while True:
                popped = await self._receive.blmpop(
                    1, 1, self._reply, direction="RIGHT", count=_READ_BATCH
                )
                if popped is None:
                    continue
                for item in cast("list[bytes]", popped[1]):
                    reply = json.loads(item)
                    future = self._waiting.get(reply["id"])
                    if future is not None and not future.done():
                        future.set_result(reply["result"])
        except Exception as exc:  # noqa: BLE001 - handed to every waiting call, and said
            # The reader is gone: every waiting call fails with its error now (not a
            # timeout later), and the next call starts a new reader.
            self._reader = None
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(exc)
            print(f"rpc client: the reply reader stopped ({exc!r})", file=sys.stderr, flush=True)

    async def aclose(self) -> None:
        """Stop the reader and close both connections."""
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
            self._reader = None
        await self._send.aclose()
        await self._receive.aclose()


def serve(url: str) -> None:
    """Answer requests until killed; a lost connection is made again (and said on stderr)."""
    client = redis.Redis.from_url(url)
    while True:
        try:
            item = client.brpop([names.RPC_REQUESTS], timeout=1)
            if item is None:
                continue
            request = json.loads(item[1])
            client.lpush(request["reply"], json.dumps({"id": request["id"], "result": None}))
        except redis.ConnectionError as exc:
            print(f"rpc server: lost Redis ({exc}); connecting again", file=sys.stderr, flush=True)
            time.sleep(0.1)


if __name__ == "__main__":
    serve(sys.argv[1])
