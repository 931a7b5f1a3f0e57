"""A TCP relay in front of a Redis master that can hold back its replication stream.

A replica that replicates through the relay, and Sentinels that watch the master through
it, see one master as usual; clients the Sentinels send there pass through it too. Once
:meth:`ReplicationRelay.hold` is called, the bytes of every replication link (a
connection that sent ``PSYNC``, ``SYNC`` or ``REPLCONF``) stop in the relay in both
directions: the replica falls behind, and the master hears no acknowledgement (``WAIT``
gets none). Every other connection flows on. When the master dies the held bytes die with
the relay's connections: a failover then promotes a replica that never had them, the
lossy failover that asynchronous replication allows.
"""

from __future__ import annotations

import socket
import threading
from typing import Self

__all__ = ["ReplicationRelay"]

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
