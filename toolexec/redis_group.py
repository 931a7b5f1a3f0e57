"""A private Redis group that fails over, on 127.0.0.1: for the tests and the benchmark.

A master, a replica of it and three Sentinels (``redis-server --sentinel``) that watch
them, each on a free port, all from the binary :class:`~toolexec.redis_server.RedisServer`
finds. :attr:`RedisSentinels.url` is the group's ``sentinel://`` URL and
:attr:`RedisSentinels.master_name` its name (``TOOLEXEC_SENTINEL_MASTER``). The Sentinels
take a master that stops answering for :attr:`RedisSentinels.down_after` seconds for
down, and two of them agree to promote the replica.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote, urlencode

import redis

from toolexec.process import POLL, _Process, free_port
from toolexec.redis_server import RedisServer, TlsFiles, find_redis_server

__all__ = ["RedisSentinels", "SentinelServer"]

#: How many Sentinels watch the group, and how many must agree that its master is down.
SENTINELS = 3
QUORUM = 2


class SentinelServer(_Process):
    """One ``redis-server --sentinel`` on 127.0.0.1, watching the master at ``master_port``.

    Args:
        master_name: The group's name.
        master_port: The master's port (on 127.0.0.1).
        directory: Where its configuration file (which Sentinel rewrites) and log live.
        binary: The server executable.
        down_after: Seconds without an answer after which it takes the master for down.
        failover_timeout: Sentinel's ``failover-timeout``, in seconds.
        auth_pass: The password of the group's servers (Sentinel's ``auth-pass``), if any.
        tls: Speak TLS only, to clients and to the group's servers (``tls-replication``).
    """

    _log_name = "sentinel.log"

    def __init__(
        self,
        *,
        master_name: str,
        master_port: int,
        directory: str | Path | None = None,
        binary: str | None = None,
        down_after: float = 1.0,
        failover_timeout: float = 5.0,
        auth_pass: str | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        super().__init__(directory)
        self.port = free_port()
        self.binary = binary if binary is not None else find_redis_server()
        self.master_name = master_name
        self.monitors = master_port  # the master's port when it started
        self.down_after = down_after
        self.failover_timeout = failover_timeout
        self.auth_pass = auth_pass
        self.tls = tls

    def start(self, timeout: float = 10.0) -> Self:
        """Start it and wait until it answers.

        Raises:
            ProcessStartFailed: It exited or did not answer within ``timeout``.
        """
        if self.is_running:
            return self
        config = self.directory / "sentinel.conf"
        name = self.master_name
        config.write_text(
            "\n".join(
                [
                    *_listen(self.port, self.tls),
                    "bind 127.0.0.1",
                    "protected-mode no",
                    f"dir {self.directory}",
                    f"sentinel monitor {name} 127.0.0.1 {self.monitors} {QUORUM}",
                    f"sentinel down-after-milliseconds {name} {int(self.down_after * 1000)}",
                    f"sentinel failover-timeout {name} {int(self.failover_timeout * 1000)}",
                    f"sentinel parallel-syncs {name} 1",
                    *([f"sentinel auth-pass {name} {self.auth_pass}"] if self.auth_pass else []),
                    "",
                ]
            )
        )
        self._spawn([self.binary, str(config), "--sentinel"], env=None, cwd=self.directory)
        deadline = time.monotonic() + timeout
        with self.client() as client:
            while True:
                assert self._proc is not None
                if self._proc.poll() is not None:
                    raise self._fail(
                        f"{self.binary} --sentinel exited with {self._proc.returncode}"
                    )
                try:
                    if client.info("server").get("process_id") == self._proc.pid:
                        return self
                except redis.RedisError:
                    pass
                if time.monotonic() > deadline:
                    raise self._fail(f"the Sentinel on port {self.port} did not answer")
                time.sleep(POLL)

    def client(self) -> redis.Redis:
        """A client of this Sentinel (its commands are ``SENTINEL ...``)."""
        return redis.Redis(
            host="127.0.0.1", port=self.port, socket_timeout=1.0, **_tls_client(self.tls)
        )

    def master_port(self) -> int | None:
        """The port of the master this Sentinel names now; None if it does not answer."""
        try:
            with self.client() as client:
                address = client.sentinel_get_master_addr_by_name(self.master_name)
        except redis.RedisError:
            return None
        return int(address[1]) if address else None


class RedisSentinels:
    """A master, its replicas and three Sentinels, started together and stopped together.

    Args:
        directory: Where each server keeps its files (a subdirectory each); temporary
            ones when omitted.
        master_name: The group's name.
        down_after: Seconds without an answer after which the Sentinels take the master
            for down (Sentinel's ``down-after-milliseconds``).
        password: The password of both data servers (``requirepass``, and the replica's
            ``masterauth``), which the Sentinels use too; :attr:`url` carries it, as kombu
            reads it: the first Sentinel's URL holds the master's password.
        relay: Given the first master's port, the port of something in front of it (a
            test's relay that can hold back the replication stream) through which the
            replicas and the Sentinels reach it, and so every client the Sentinels send
            there; None (the default): they reach it directly.
        replicas: How many replicas (one by default). With ``TOOLEXEC_REPLICA_ACKS=N``,
            a group that is to serve on after losing its master needs N + 1.
    """

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        master_name: str = "toolexec",
        down_after: float = 1.0,
        password: str | None = None,
        tls: TlsFiles | None = None,
        relay: Callable[[int], int] | None = None,
        replicas: int = 1,
    ) -> None:
        self.master_name = master_name
        self.down_after = down_after
        self.password = password
        self.tls = tls
        root = Path(directory) if directory is not None else None
        binary = find_redis_server()
        # Each data server may become the other's replica: both know the password.
        auth = ["--masterauth", password] if password else []
        auth += ["--tls-replication", "yes"] if tls else []
        self.master = RedisServer(
            directory=_sub(root, "master"),
            binary=binary,
            password=password,
            tls=tls,
            extra_args=auth,
        )
        #: Where the replicas and the Sentinels reach the first master: its own port, or
        #: the relay's.
        self.master_seen_at = self.master.port if relay is None else relay(self.master.port)
        self.replicas = [
            RedisServer(
                directory=_sub(root, "replica" if i == 0 else f"replica-{i}"),
                binary=binary,
                password=password,
                tls=tls,
                extra_args=["--replicaof", "127.0.0.1", str(self.master_seen_at), *auth],
            )
            for i in range(replicas)
        ]
        self.replica = self.replicas[0]
        self.sentinels = [
            SentinelServer(
                master_name=master_name,
                master_port=self.master_seen_at,
                directory=_sub(root, f"sentinel-{i}"),
                binary=binary,
                down_after=down_after,
                auth_pass=password,
                tls=tls,
            )
            for i in range(SENTINELS)
        ]

    @property
    def url(self) -> str:
        """The group's ``sentinel://`` URL: every Sentinel, database 0, the master's
        password (in the first part) if the group has one, and TLS's parameters (the CA
        to trust) if it speaks TLS."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        parts = [
            f"sentinel://{auth if i == 0 else ''}127.0.0.1:{s.port}"
            for i, s in enumerate(self.sentinels)
        ]
        query = ""
        if self.tls is not None:
            query = "?" + urlencode(
                {"ssl_cert_reqs": "required", "ssl_ca_certs": str(self.tls.ca_file)}
            )
        return ";".join(parts) + "/0" + query

    @property
    def servers(self) -> list[RedisServer]:
        """The data servers: the first master, then its replicas."""
        return [self.master, *self.replicas]

    def start(self, timeout: float = 30.0) -> Self:
        """Start every server; return once the replica is in sync and every Sentinel
        knows the replica and the other Sentinels (so that a failover can happen).

        Raises:
            ProcessStartFailed: A server did not start.
            TimeoutError: The group did not form within ``timeout`` seconds.
        """
        self.master.start()
        for replica in self.replicas:
            replica.start()
        for sentinel in self.sentinels:
            sentinel.start()
        deadline = time.monotonic() + timeout
        while not self._formed():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Redis group {self.master_name!r} did not form")
            time.sleep(0.1)
        return self

    def _formed(self) -> bool:
        try:
            for server in self.replicas:
                with self._data_client(server.port) as replica:
                    if replica.info("replication").get("master_link_status") != "up":
                        return False
            for sentinel in self.sentinels:
                with sentinel.client() as client:
                    master = client.sentinel_master(self.master_name)
                    if int(master.get("num-slaves", 0)) < len(self.replicas):
                        return False
                    if int(master.get("num-other-sentinels", 0)) < SENTINELS - 1:
                        return False
        except redis.RedisError:
            return False
        return True

    def master_port(self) -> int | None:
        """The master's port as most Sentinels name it now (None if they do not agree)."""
        named = [s.master_port() for s in self.sentinels]
        for port in set(named):
            if port is not None and named.count(port) >= QUORUM:
                return port
        return None

    def server_on(self, port: int) -> RedisServer:
        """The data server listening on ``port``, or reached through it (the relay's)."""
        if port == self.master_seen_at:
            return self.master
        return next(server for server in self.servers if server.port == port)

    def wait_for_failover(self, old_port: int, timeout: float = 30.0) -> int:
        """Wait until the Sentinels name a master other than ``old_port`` and it answers
        as a master; its port.

        Raises:
            TimeoutError: No new master within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            port = self.master_port()
            if port is not None and port != old_port:
                try:
                    with self._data_client(port) as client:
                        if client.info("replication").get("role") == "master":
                            return port
                except redis.RedisError:
                    pass
            time.sleep(0.05)
        raise TimeoutError(f"no new master of {self.master_name!r} within {timeout}s")

    def _data_client(self, port: int) -> redis.Redis:
        return redis.Redis(
            port=port, password=self.password, socket_timeout=1.0, **_tls_client(self.tls)
        )

    def close(self) -> None:
        """Stop every server (by PID) and remove the temporary directories."""
        for process in [*self.sentinels, *self.replicas, self.master]:
            process.close()

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()


def _sub(root: Path | None, name: str) -> Path | None:
    if root is None:
        return None
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def _listen(port: int, tls: TlsFiles | None) -> list[str]:
    """A Sentinel's configuration lines for where it listens: plain, or TLS only (then it
    speaks TLS to the group's servers and to the other Sentinels too)."""
    if tls is None:
        return [f"port {port}"]
    return [
        "port 0",
        f"tls-port {port}",
        f"tls-cert-file {tls.cert_file}",
        f"tls-key-file {tls.key_file}",
        f"tls-ca-cert-file {tls.ca_file}",
        "tls-auth-clients no",
        "tls-replication yes",
    ]


def _tls_client(tls: TlsFiles | None) -> dict[str, Any]:
    """redis-py's options of a client of a server that speaks TLS (none without)."""
    if tls is None:
        return {}
    return {"ssl": True, "ssl_cert_reqs": "required", "ssl_ca_certs": str(tls.ca_file)}
