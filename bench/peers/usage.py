"""What a side's calls cost, process by process, and in Redis commands.

A :class:`Reading` is taken before and after each block of calls: the CPU seconds of
the side's worker (its main process and its direct children apart, :mod:`bench.cpu`),
of this process (the client: all its threads), of the Redis server, and the commands
the server has run (``INFO commandstats``, less the ``INFO`` readings themselves).
:class:`Usage` adds up the differences over a side's blocks at one level. A side's own
worker is charged all it spends over its blocks, its background (heartbeats, polls)
included: under load that is part of what it costs. The processes every side shares,
this one and Redis, and the server's commands are charged only above what they spend
with no calls (:meth:`Usage.net`), read over an idle window with every side running.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from redis import Redis

from bench.cpu import cpu_split, own_cpu

__all__ = ["Reading", "Usage", "commands_run", "idle_usage"]


def commands_run(client: Redis) -> int:
    """Commands the server has run so far, the ``INFO`` readings left out."""
    stats = client.info("commandstats")
    return sum(int(s["calls"]) for name, s in stats.items() if name != "cmdstat_info")


@dataclass(frozen=True, kw_only=True)
class Reading:
    """CPU seconds so far of each process role, and the server's command count."""

    main: float
    children: float
    client: float
    redis: float
    commands: int

    @classmethod
    def take(cls, server: Redis, server_pid: int | None, worker_pid: int | None) -> Reading:
        """Read all of them now."""
        split = cpu_split(worker_pid)
        commands = commands_run(server)
        return cls(
            main=split.main,
            children=split.children,
            client=time.process_time(),
            redis=0.0 if server_pid is None else own_cpu(server_pid),
            commands=commands,
        )


def idle_usage(
    server: Redis, server_pid: int | None, worker_pid: int | None, seconds: float = 1.0
) -> Usage:
    """What the readings give over ``seconds`` with no calls (for :meth:`Usage.net`)."""
    before = Reading.take(server, server_pid, worker_pid)
    start = time.perf_counter()
    time.sleep(seconds)
    elapsed = time.perf_counter() - start
    usage = Usage()
    usage.add(before, Reading.take(server, server_pid, worker_pid), seconds=elapsed, calls=0)
    return usage


@dataclass(kw_only=True)
class Usage:
    """What a side's blocks cost: seconds, calls, CPU seconds per role, commands."""

    calls: int = 0
    seconds: float = 0.0
    #: Seconds the readings spanned: ``seconds``, unless a block was read after it ended
    #: (what the shared processes spend with no calls comes off for all of it).
    span: float = 0.0
    main: float = 0.0
    children: float = 0.0
    client: float = 0.0
    redis: float = 0.0
    commands: float = 0.0

    def add(
        self,
        before: Reading,
        after: Reading,
        *,
        seconds: float,
        calls: int,
        span: float | None = None,
    ) -> None:
        """Count one block of ``calls`` that took ``seconds``, read around it; ``span``:
        the seconds between the readings, where ``after`` was taken later than the
        block's end (its trailing writes waited for)."""
        self.calls += calls
        self.seconds += seconds
        self.span += seconds if span is None else span
        self.main += after.main - before.main
        self.children += after.children - before.children
        self.client += after.client - before.client
        self.redis += after.redis - before.redis
        self.commands += after.commands - before.commands

    def net(self, idle: Usage) -> Usage:
        """This usage with the shared processes' and the commands' idle rate taken away.

        ``idle`` is what the same readings gave over a window of no calls; its rate per
        second, over the seconds this usage's readings spanned, comes off the client,
        Redis and the commands (never below zero). The worker's CPU stays whole over its
        blocks; only for the seconds its readings ran past them (:meth:`add`'s ``span``:
        trailing writes waited for) does its idle rate come off too.
        """
        if idle.seconds <= 0:
            return self
        scale = self.span / idle.seconds
        past = max(0.0, self.span - self.seconds) / idle.seconds

        def less(spent: float, idle_spent: float) -> float:
            return max(0.0, spent - idle_spent * scale)

        return Usage(
            calls=self.calls,
            seconds=self.seconds,
            span=self.span,
            main=max(0.0, self.main - idle.main * past),
            children=max(0.0, self.children - idle.children * past),
            client=less(self.client, idle.client),
            redis=less(self.redis, idle.redis),
            commands=less(self.commands, idle.commands),
        )

    @property
    def rate(self) -> float:
        """Calls per second over all the blocks."""
        return self.calls / self.seconds if self.seconds > 0 else float("nan")

    @property
    def cpu(self) -> float:
        """CPU seconds of every process role together."""
        return self.main + self.children + self.client + self.redis

    def per_call(self, value: float) -> float:
        """``value`` divided by the calls."""
        return value / self.calls if self.calls else float("nan")
