"""What the broker tests share: their queue names, RabbitMQ clean-up, and a TCP proxy.

The broker tests (``test_brokers.py``) run every guarantee that is about the broker on
Redis and on the machine's RabbitMQ (127.0.0.1:5672). RabbitMQ is shared, so their
queues carry a prefix unique to the session (:func:`queue_names`), handed to the
workers in :data:`QUEUE_VARIABLE` (``amqp_tools.py`` reads it) and deleted at the end
(:func:`delete_amqp_queues`); nothing else on that server is touched.

:class:`TcpProxy` stands between the client and a broker, so a test can take the broker
away from the client (and give it back) without stopping a server others use, or make
it slow (its ``latency``) without freezing it.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from kombu.connection import Connection

__all__ = [
    "AMQP_URL",
    "QUEUE_VARIABLE",
    "TcpProxy",
    "amqp_connection",
    "delete_amqp_queues",
    "queue_names",
]

#: The machine's RabbitMQ.
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"
#: The environment variable that gives the workers the session's queue prefix.
QUEUE_VARIABLE = "AMQP_TOOLS_QUEUE"


def queue_names(prefix: str) -> tuple[str, str]:
    """(the shared queue, the solo queue) of the session whose prefix is ``prefix``."""
    return prefix, f"{prefix}_solo"


def amqp_connection() -> Any:
    """A kombu connection to the machine's RabbitMQ (use it in a ``with`` block)."""
    return Connection(AMQP_URL, connect_timeout=5)  # type: ignore[no-untyped-call]


def delete_amqp_queues(names: Iterable[str]) -> None:
    """Delete ``names`` from the machine's RabbitMQ (and nothing else); absent ones are skipped."""
    with amqp_connection() as connection:
        for name in names:
            channel = connection.channel()
            try:
                channel.queue_declare(name, passive=True)
            except connection.channel_errors:  # NOT_FOUND closes the channel: nothing to delete
                continue
            channel.queue_delete(name)
            channel.close()


class TcpProxy:
    """Forwards connections on a local port to ``target_port``, until :meth:`stop`.

    :meth:`stop` closes the listener and every forwarded connection, as a broker that
    went away would; :meth:`start` listens on the same port again.

    Attributes:
        latency: Seconds each reply of the target is held back before it is passed on
            (0 by default): a broker that is slow but answering. Requests go through at
            once, replies keep their order and do not wait on each other, so every round
            trip takes ``latency`` longer. It may be changed at any time; it applies to
            what the target sends from then on.

    Args:
        target_port: The port on 127.0.0.1 to forward to.
        port: The port to listen on (a free one when omitted).
    """

    def __init__(self, target_port: int, port: int = 0) -> None:
        self.target_port = target_port
        self.port = port
        self.latency = 0.0
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self) -> TcpProxy:
        """Listen (again) and forward every connection."""
        listener = socket.create_server(("127.0.0.1", self.port))
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._spawn(self._accept, listener)
        return self

    def stop(self) -> None:
        """Close the listener and every connection, and wait for the forwarding threads."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        threads, self._threads = self._threads, []
        for thread in threads:
            thread.join(timeout=5)

    def _spawn(self, target: Callable[..., object], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stopped
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets |= {client, server}
            self._spawn(self._pump, client, server)
            self._spawn(self._pump_late, server, client)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        _shut(source, sink)

    def _pump_late(self, source: socket.socket, sink: socket.socket) -> None:
        # Each chunk is stamped with when it is due and handed to a thread that passes it
        # on then: reading never waits on the delay, so chunks do not queue behind it.
        due: queue.SimpleQueue[tuple[float, bytes] | None] = queue.SimpleQueue()
        self._spawn(self._pass_on, due, source, sink)
        try:
            while data := source.recv(65536):
                due.put((time.monotonic() + self.latency, data))
        except OSError:
            pass
        due.put(None)

    @staticmethod
    def _pass_on(
        due: queue.SimpleQueue[tuple[float, bytes] | None],
        source: socket.socket,
        sink: socket.socket,
    ) -> None:
        while (chunk := due.get()) is not None:
            at, data = chunk
            if (late := at - time.monotonic()) > 0:
                time.sleep(late)  # the latency itself: this chunk is not due before then
            try:
                sink.sendall(data)
            except OSError:
                break
        _shut(source, sink)


def _shut(*sockets: socket.socket) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
