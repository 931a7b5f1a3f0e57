"""bench.redis_rpc, the floor the benchmark measures against: each call waits for its own
reply, and a reply left by an earlier call that timed out is dropped, not taken."""

from __future__ import annotations

import concurrent.futures
import json

import redis

from bench import names
from bench.redis_rpc import RpcClient
from toolexec import RedisServer

from .polling import wait_until


def test_a_call_takes_its_own_reply_and_drops_one_an_earlier_call_left(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    client = RpcClient(redis_server.url)
    redis_client.delete(names.RPC_REQUESTS)
    # What a readiness check sent before the server ran leaves behind: a late reply.
    redis_client.lpush(client._reply, json.dumps({"id": "earlier", "result": "stale"}))
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            call = pool.submit(client.call, 10.0)
            assert wait_until(lambda: redis_client.llen(names.RPC_REQUESTS) == 1, timeout=5)
            request = json.loads(redis_client.rpop(names.RPC_REQUESTS))  # the server's part
            redis_client.lpush(request["reply"], json.dumps({"id": request["id"], "result": "own"}))
            assert call.result(timeout=10) == "own"
        assert redis_client.llen(client._reply) == 0
    finally:
        client.close()
