"""Keep a worker visible while its main process cannot beat: a small process of its own.

On the solo, threads and asyncio pools a tool runs in the worker's main process, beside
its heartbeat thread (:class:`executor.worker.Heartbeat`). A tool in C code that holds
the interpreter's lock (a long regular expression, a C extension's loop) stops that
thread as well: the worker's key and the records of the calls it holds would lapse
within an interval, every waiting client would take the worker for dead, and the
catalog would drop its tools, while the process lives and will answer. So a worker of
those pools starts a keeper (:class:`Keeper`), a process of its own with its own
interpreter, which the main process's lock cannot stop.

The heartbeat writes, after each beat, the beat's number and the keys it refreshed into
a small file (:meth:`Keeper.note`). The keeper reads that file ten times an interval and
does nothing while the number moves. Once it has not moved for 0.4 of an interval (the
heartbeat beats three times an interval, and its key lives one), the keeper writes
those keys again as the last beat wrote them (so a client still sees that the worker has
not beaten since), or, while Redis refuses writes for want of memory, keeps them alive
with ``PEXPIRE``, until the heartbeat beats again.
A process that is alive is not a dead worker: a call it holds is not lost while it
lives, however long it takes, and its caller's deadline is what ends its wait. The
keeper leaves as soon as the worker's main process is gone (it stops keeping anything
alive, and the keys lapse as the worker's death requires), or when the worker stops it.
On the prefork pool tools run in pool processes, whose lock is not the main process's,
so no keeper is started.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from wire import keys
from wire.connect import sync_client
from wire.settings import Settings

__all__ = ["Keeper", "main"]

logger = logging.getLogger(__name__)

#: The heartbeat beats three times an interval and its key lives one: the keeper steps in
#: once it has not beaten for 0.4 of an interval, while the key still lives, and looks
#: this often (as shares of the interval); a key that lapsed meanwhile is written again.
_STALLED, _TICK = 0.4, 0.1


class Keeper:
    """The keeper process of this worker, and the file through which the heartbeat tells it.

    Args:
        worker_key: The worker's heartbeat key.
        interval: The heartbeat interval.
    """

    def __init__(self, *, worker_key: str, interval: float) -> None:
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
        handle, name = tempfile.mkstemp(prefix="toolexec-keeper-", suffix=".json", dir=folder)
        os.close(handle)
        self._state = Path(name)
        self._worker_key = worker_key
        self._interval = interval
        self._beats = 0
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the keeper process (the worker's environment, so its settings, are its own)."""
        if not self._beats:
            self.note([])
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from executor.keeper import main; sys.exit(main())",
                str(os.getpid()),
                str(self._state),
            ],
            stdin=subprocess.DEVNULL,
        )

    def note(self, records: list[tuple[str, str]], beat: str = "") -> None:
        """After a beat: its number, what it wrote (the worker's key's value ``beat``, and
        each record with its holder), for the keeper."""
        self._beats += 1
        text = json.dumps(
            {
                "beat": self._beats,
                "worker": self._worker_key,
                "value": beat,
                "records": records,
                "interval": self._interval,
            }
        )
        partial = self._state.with_suffix(".partial")
        partial.write_text(text)
        os.replace(partial, self._state)

    def stop(self) -> None:
        """Stop the keeper and remove its file."""
        process, self._process = self._process, None
        if process is not None:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        with contextlib.suppress(FileNotFoundError):
            self._state.unlink()


def main(argv: list[str] | None = None) -> int:
    """The keeper process: ``main()`` with ``sys.argv[1:]`` the worker's pid and the state file."""
    parent, state = (argv if argv is not None else sys.argv[1:])[:2]
    settings = Settings.from_env()
    client = sync_client(
        settings.redis_url,
        master=settings.sentinel_master,
        socket_timeout=2,
        socket_connect_timeout=2,
    )
    last_beat, moved_at = -1, time.monotonic()
    while os.getppid() == int(parent):
        try:
            seen = json.loads(Path(state).read_text())
        except (OSError, ValueError):
            return 0  # the worker removed it: it is stopping
        interval = float(seen["interval"])
        if seen["beat"] != last_beat:
            last_beat, moved_at = seen["beat"], time.monotonic()
        elif time.monotonic() - moved_at > interval * _STALLED:
            _keep_alive(client, seen, interval)
        time.sleep(interval * _TICK)
    return 0


def _keep_alive(client: redis.Redis, seen: dict[str, Any], interval: float) -> None:
    # What the last beat wrote, written again as it was (its time and counts are the last
    # beat's: a client sees this worker has not beaten since, catalog.beating_since): a
    # key that lapsed while this process was late comes back. Redis refusing writes for
    # want of memory still takes PEXPIRE.
    worker_ms, record_ms = int(interval * 1000), int(interval * keys.HELD_MARKER_BEATS * 1000)
    pipe = client.pipeline(transaction=False)
    if seen["value"]:
        pipe.set(seen["worker"], seen["value"], px=worker_ms)
    for record, holder in seen["records"]:
        pipe.set(record, holder, px=record_ms)
    try:
        if not any(
            isinstance(r, redis.exceptions.OutOfMemoryError)
            for r in pipe.execute(raise_on_error=False)
        ):
            return
        pipe = client.pipeline(transaction=False)
        pipe.pexpire(seen["worker"], worker_ms)
        for record, _ in seen["records"]:
            pipe.pexpire(record, record_ms)
        pipe.execute()
    except redis.RedisError:  # Redis away: the next tick tries again
        pass
