"""The floor: a minimal hand-written RPC over Redis lists (LPUSH request, BRPOP reply).

``python -m bench.redis_rpc URL`` runs the server: one process that pops a request,
pushes an empty reply and loops. :class:`RpcClient` is the caller. Nothing is
validated, encoded beyond JSON or timed out on the server: no real system can be
cheaper than this on the same Redis.
"""

from __future__ import annotations

import json
import sys
import uuid

import redis

from bench import names

__all__ = ["RpcClient", "RpcTimeout", "serve"]


class RpcTimeout(Exception):
    """No reply came within the timeout."""


class RpcClient:
    """Calls the hand-written RPC server; one reply list per client."""

    def __init__(self, url: str) -> None:
        self._redis = redis.Redis.from_url(url)
        self._reply = names.rpc_reply(uuid.uuid4().hex)

    def call(self, timeout: float = 10.0) -> object:
        """Send one request and block until its reply, at most ``timeout`` seconds."""
        request = json.dumps({"id": uuid.uuid4().hex, "reply": self._reply})
        self._redis.lpush(names.RPC_REQUESTS, request)
        item = self._redis.brpop([self._reply], timeout=timeout)
        if item is None:
            raise RpcTimeout(f"no reply from the RPC server within {timeout}s")
        return json.loads(item[1])["result"]

    def close(self) -> None:
        """Close the connection pool."""
        self._redis.close()


def serve(url: str) -> None:
    """Answer requests until killed."""
    client = redis.Redis.from_url(url)
    while True:
        item = client.brpop([names.RPC_REQUESTS], timeout=1)
        if item is None:
            continue
        request = json.loads(item[1])
        client.lpush(request["reply"], json.dumps({"id": request["id"], "result": None}))


if __name__ == "__main__":
    serve(sys.argv[1])
