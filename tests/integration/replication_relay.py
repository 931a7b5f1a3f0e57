"""A TCP relay in front of a Redis master that can hold back its replication stream.

A replica that replicates through the relay, and Sentinels that watch the master through
it, see one master as usual; clients the Sentinels send there pass through it too. Once
:meth:`ReplicationRelay.hold` is called, the bytes of every replication link (a
connection that sent ``PSYNC``, ``SYNC`` or ``REPLCONF``) stop in the relay in both
directions: the replica falls behind, and the master hears no acknowledgement (``WAIT``
gets none). Every other connection flows on. When the master dies the held bytes die with
the relay's connections: a failover then promotes a replica that never had them, the
lossy failover that asynchronous replication allows.

:class:`RelayProcess` runs the relay in a process of its own
(``python -m tests.integration.replication_relay UPSTREAM``, told what to do on its
standard input): its pumps are threads, a pair per connection, and in the test's process
they would compete for the interpreter's lock with the callers whose deadlines the test
measures, more so the more connections and commands the product makes.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from typing import IO, Self

__all__ = ["RelayProcess", "ReplicationRelay"]

#: What a replica sends its master, and no client does: the commands' names as RESP
#: bulk strings (a client's argument that merely contains the word is not one).
_REPLICATION_COMMANDS = (b"$5\r\nPSYNC\r\n", b"$4\r\nSYNC\r\n", b"$8\r\nREPLCONF\r\n")
_CHUNK = 65536


class ReplicationRelay:
    """Relay ``127.0.0.1:<port>`` to ``127.0.0.1:<upstream>``; hold replication on demand.

    Args:
        upstream: The master's port.
    """

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self.replication_links = 0

    def start(self) -> Self:
        """Accept connections in a thread of its own."""
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()
        return self

    def hold(self) -> None:
        """From now on, no byte of a replication link passes, either way."""
        self._flowing.clear()

    def release(self) -> None:
        """Let the replication links flow again (what they held goes first)."""
        self._flowing.set()

    def close(self) -> None:
        """Stop accepting and close every connection (held bytes are dropped)."""
        self._closed.set()
        self._flowing.set()  # a pump waiting to pass held bytes finds its socket closed
        self._listener.close()
        with self._lock:
            sockets, self._sockets = set(self._sockets), set()
        for sock in sockets:
            _close(sock)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream), timeout=1.0)
                upstream.settimeout(None)
            except OSError:  # the master is gone: its watchers see a connection that drops
                _close(downstream)
                continue
            link = _Link(self, downstream, upstream)
            with self._lock:
                if self._closed.is_set():
                    link.close()
                    return
                self._sockets.update((downstream, upstream))
            link.start()


class _Link:
    """One relayed connection: a pump each way; a replication link's pumps obey the hold."""

    def __init__(self, relay: ReplicationRelay, downstream: socket.socket, up: socket.socket):
        self._relay = relay
        self._down = downstream
        self._up = up
        self._replication = False

    def start(self) -> None:
        for source, target, outbound in (
            (self._down, self._up, True),
            (self._up, self._down, False),
        ):
            threading.Thread(
                target=self._pump, args=(source, target, outbound), name="relay-pump", daemon=True
            ).start()

    def close(self) -> None:
        _close(self._down)
        _close(self._up)

    def _pump(self, source: socket.socket, target: socket.socket, outbound: bool) -> None:
        try:
            while True:
                data = source.recv(_CHUNK)
                if not data:
                    return
                if (
                    outbound
                    and not self._replication
                    and any(command in data.upper() for command in _REPLICATION_COMMANDS)
                ):
                    self._mark()
                if self._replication:
                    self._relay._flowing.wait()
                    if self._relay._closed.is_set():
                        return
                target.sendall(data)
        except OSError:
            return
        finally:
            self.close()

    def _mark(self) -> None:
        self._replication = True
        with self._relay._lock:
            self._relay.replication_links += 1


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


class RelayProcess:
    """A :class:`ReplicationRelay` in a child process, with the same interface.

    Args:
        upstream: The master's port.
    """

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.port = 0
        self._process: subprocess.Popen[str] | None = None
        self._links_at_close = 0

    def start(self) -> Self:
        """Start the child and wait for the port it relays on."""
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.replication_relay", str(self.upstream)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.port = int(self._answer())
        return self

    def hold(self) -> None:
        """From now on, no byte of a replication link passes, either way."""
        self._ask("hold")

    @property
    def replication_links(self) -> int:
        """How many replication links the relay has seen (until it was closed)."""
        if self._process is None:
            return self._links_at_close
        return int(self._ask("links"))

    def close(self) -> None:
        """Close every connection and end the child (by its PID)."""
        if self._process is None:
            return
        try:
            self._links_at_close = int(self._ask("links"))
        except (OSError, RuntimeError, ValueError):
            pass
        process, self._process = self._process, None
        assert process.stdin is not None
        try:
            process.stdin.close()
            process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()
        finally:
            if process.stdout is not None:
                process.stdout.close()

    def _ask(self, command: str) -> str:
        assert self._process is not None and self._process.stdin is not None
        self._process.stdin.write(command + "\n")
        self._process.stdin.flush()
        return self._answer()

    def _answer(self) -> str:
        assert self._process is not None and self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"the relay process exited ({self._process.poll()})")
        return line.strip()


def _serve(upstream: int, commands: IO[str], answers: IO[str]) -> None:
    with ReplicationRelay(upstream) as relay:
        print(relay.port, file=answers, flush=True)
        for command in commands:
            if command.strip() == "hold":
                relay.hold()
                print("held", file=answers, flush=True)
            elif command.strip() == "links":
                print(relay.replication_links, file=answers, flush=True)


if __name__ == "__main__":
    _serve(int(sys.argv[1]), sys.stdin, sys.stdout)
