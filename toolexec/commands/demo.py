"""``toolexec demo``: the whole path on one machine, with nothing configured.

It starts a private Redis-compatible server and two real worker processes, runs a
scripted LazyBridge agent (no LLM, no network) against the starter catalogue, prints
what the model was shown for each call (results, one validation error, one timeout),
and stops everything it started. When it fails, it keeps the logs of what it started
and says where.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from toolexec import RedisServer, WorkerProcess
from wire.settings import Settings

__all__ = ["keep_logs", "run_demo"]

_SCRIPT: list[Any] = [
    [("get_today_date", {}), ("search", {"query": "red-headed league pawnbroker", "limit": 2})],
    [("book_flight", {"flight_id": "BA117", "passenger": "Ada Lovelace"})],
    [("book_flight", {"flight_id": "next tuesday", "passenger": "Ada Lovelace"})],
    [("slow_report", {"seconds": 5})],
    "Booked BA117 for Ada Lovelace; the slow report did not finish in time.",
]


def run_demo(
    out: TextIO = sys.stdout, *, err: TextIO = sys.stderr, keep_logs_in: Path | None = None
) -> int:
    """Run the demo, printing to ``out``; returns the process exit code (0, or 1 if it failed).

    When it fails it says why on ``err`` in one line and keeps the logs of the processes
    it started (the Redis server's and each worker's): in ``keep_logs_in``, or in a new
    directory under the system's temporary directory, named on ``err``. Everything else
    it made is removed.
    """

    def say(line: str = "") -> None:
        print(line, file=out, flush=True)

    with tempfile.TemporaryDirectory(prefix="toolexec-demo-") as tmp:
        root = Path(tmp)
        try:
            _run(root, say)
        except Exception as exc:  # noqa: BLE001 - any failure: say it in one line, keep the logs
            kept = keep_logs(root, keep_logs_in)
            message = str(exc).replace(str(root), str(kept)).strip().splitlines()
            print(
                f"toolexec demo failed: {type(exc).__name__}: {message[0] if message else ''}",
                file=err,
            )
            print(f"the logs of the processes it started are kept in {kept}", file=err, flush=True)
            return 1
    return 0


def keep_logs(root: Path, target: Path | None = None) -> Path:
    """Copy every ``*.log`` under ``root`` into ``target`` (default: a new temporary directory).

    Relative paths are kept (``logs/demo1.log``, ``redis/redis.log``); returns ``target``.
    """
    kept = Path(tempfile.mkdtemp(prefix="toolexec-demo-logs-")) if target is None else target
    kept.mkdir(parents=True, exist_ok=True)
    for log in sorted(root.rglob("*.log")):
        destination = kept / log.relative_to(root)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, destination)
    return kept


def _run(root: Path, say: Callable[[str], None]) -> None:
    from agent_client import configure, remote_tool
    from agent_client.testing import ScriptedProvider, scripted_agent

    with RedisServer(directory=root / "redis") as server:
        env = {
            "TOOLEXEC_BROKER_URL": server.url,
            "TOOLEXEC_DATA_DIR": str(root / "data"),
            "TOOLEXEC_HEARTBEAT_INTERVAL": "1",
        }
        say(f"started a private Redis server ({server.description}) on port {server.port}")
        workers = [
            WorkerProcess(
                name=f"demo{n}", pool="prefork", concurrency=2, env=env, log_dir=root / "logs"
            )
            for n in (1, 2)
        ]
        try:
            for worker in workers:
                worker.start()
                info = worker.info
                assert info is not None
                say(
                    f"started worker {info.hostname} (pid {info.pid}) serving: "
                    f"{', '.join(info.tools)}"
                )
            client = configure(Settings.from_env(env))
            try:
                tools = [
                    remote_tool("get_today_date"),
                    remote_tool("search"),
                    remote_tool("book_flight"),
                    remote_tool("slow_report", timeout=0.5),
                ]
                provider = ScriptedProvider(_SCRIPT)
                agent = scripted_agent(tools, provider)
                say("\nrunning a scripted LazyBridge agent (slow_report has a 0.5 s deadline)...")
                started = time.monotonic()
                envelope = agent("Book BA117 for Ada Lovelace and get me the slow report.")
                elapsed = time.monotonic() - started
                say("\nwhat the model was shown:")
                for result in provider.tool_results():
                    text = str(result.content)
                    say(
                        f"  {result.tool_name or '?':<15} "
                        f"{text[:150]}{'...' if len(text) > 150 else ''}"
                    )
                say(f"\nagent answered: {envelope.text()}")
                say(f"agent run took {elapsed:.2f} s; agent-process threads now: {_thread_count()}")
            finally:
                client.close()
        finally:
            for worker in workers:
                worker.stop()
            say("stopped the workers and the Redis server")


def _thread_count() -> int:
    import threading

    return threading.active_count()
