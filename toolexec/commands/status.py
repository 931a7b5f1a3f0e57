"""``toolexec tools`` and ``toolexec status``: what the live workers serve, and how they fare.

Both read the live state from Redis (:mod:`toolexec.status`) and print it as tables
(:mod:`toolexec.commands.render`) or, with ``--json``, as JSON. ``tools`` exits 4 when
no live worker serves any tool. ``status`` exits 5 when the queues' broker cannot be
read, after showing the rest; with ``--worker`` only that worker's health decides (4
when it is not live). ``status --watch`` refreshes until interrupted or ``--count``
snapshots; a refresh that cannot reach Redis says so on stderr and the watch goes on.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from rich.console import Console
from rich.live import Live

from toolexec.commands.exits import CommandFailed, ExitCode, one_line
from toolexec.commands.render import status_view, tools_view
from wire.connect import sync_client
from wire.settings import Settings
from wire.urls import is_redis_url

__all__ = ["list_tools", "show_status"]


def list_tools(settings: Settings, *, as_json: bool) -> None:
    """Run ``toolexec tools``: print the tools live workers serve.

    Raises:
        CommandFailed: No live worker serves any tool (exit code 4), or Redis is
            unreachable (5).
    """
    from toolexec.status import read_live, tool_rows

    with _redis(settings) as client:
        rows = tool_rows(read_live(client), settings)
    if as_json:
        print(json.dumps(rows, ensure_ascii=False))
    elif rows:
        console = Console()
        console.print(tools_view(rows, console.width))
    if not rows:
        raise CommandFailed(
            f"no live worker serves any tool (Redis at {_redacted(settings.redis_url)})",
            ExitCode.NOT_FOUND,
        )


def show_status(
    settings: Settings,
    *,
    as_json: bool,
    watch: bool,
    interval: float,
    count: int | None,
    only: str | None,
) -> None:
    """Run ``toolexec status``: print one snapshot, or with ``watch`` one every
    ``interval`` seconds.

    Raises:
        CommandFailed: The worker ``only`` is not live (exit code 4); the queues'
            broker cannot be read (5, without ``only``); Redis is unreachable (5).
    """
    with _redis(settings) as client:
        if not watch:
            snapshot = _snapshot(client, None, only, settings)
            _show(snapshot, as_json=as_json)
            if only is not None:
                if not snapshot["workers"]:
                    raise CommandFailed(f"no live worker named {only!r}", ExitCode.NOT_FOUND)
            elif "broker_error" in snapshot:  # a worker's health never hangs on the queues
                raise CommandFailed(snapshot["broker_error"], ExitCode.BROKER_UNAVAILABLE)
            return
        snapshots = range(count) if count is not None else itertools.count()
        with _broker(settings, client) as broker:
            try:
                if as_json:
                    for n in snapshots:
                        if n:
                            time.sleep(interval)
                        _show(_snapshot_or_error(client, broker, only, settings), as_json=True)
                    return
                first = _snapshot(client, broker, only, settings)
                with Live(status_view(first), auto_refresh=False) as live:
                    for _ in itertools.islice(snapshots, 1, None):
                        time.sleep(interval)
                        snapshot = _snapshot_or_error(client, broker, only, settings)
                        if "error" not in snapshot:
                            live.update(status_view(snapshot), refresh=True)
            except KeyboardInterrupt:
                return


@contextmanager
def _broker(settings: Settings, client: redis.Redis) -> Iterator[redis.Redis | None]:
    """For a watch: one client of the broker's Redis for every snapshot, when it is not
    ``client``'s (None: the queues are in ``client``'s Redis, or on RabbitMQ)."""
    from toolexec.status import broker_client, queues_in_store

    url = settings.broker_url
    if not is_redis_url(url) or queues_in_store(client, url, settings.redis_url):
        yield None
        return
    broker = broker_client(url, settings.sentinel_master)
    try:
        yield broker
    finally:
        broker.close()


def _snapshot(
    client: redis.Redis, broker: redis.Redis | None, only: str | None, settings: Settings
) -> dict[str, Any]:
    """One snapshot of the deployment ``settings`` name; ``broker`` as a watch keeps it."""
    from toolexec.status import status_snapshot

    return status_snapshot(
        client,
        worker=only,
        broker_url=settings.broker_url,
        sentinel_master=settings.sentinel_master,
        redis_url=settings.redis_url,
        broker=broker,
    )


def _snapshot_or_error(
    client: redis.Redis, broker: redis.Redis | None, only: str | None, settings: Settings
) -> dict[str, Any]:
    """:func:`_snapshot`, or a line on stderr and an error entry when Redis is away."""
    try:
        return _snapshot(client, broker, only, settings)
    except redis.RedisError as exc:
        print(f"toolexec: Redis is unreachable: {one_line(str(exc))}", file=sys.stderr, flush=True)
        return {"time": time.time(), "error": str(exc)}


def _show(snapshot: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(snapshot, ensure_ascii=False), flush=True)
    else:
        Console().print(status_view(snapshot))


@contextmanager
def _redis(settings: Settings) -> Iterator[redis.Redis]:
    client = sync_client(
        settings.redis_url,
        master=settings.sentinel_master,
        socket_connect_timeout=2.0,
        socket_timeout=5.0,
    )
    try:
        yield client
    except redis.RedisError as exc:
        raise CommandFailed(
            f"Redis at {_redacted(settings.redis_url)} is unreachable: {one_line(str(exc))}",
            ExitCode.BROKER_UNAVAILABLE,
        ) from None
    finally:
        client.close()


def _redacted(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    credentials, at, location = rest.rpartition("@")
    return f"{scheme}{sep}***@{location}" if at and credentials else url
