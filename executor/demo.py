"""``toolexec demo``: the whole path on one machine, with nothing configured.

It starts a private Redis-compatible server and two real worker processes, runs a
scripted LazyBridge agent (no LLM, no network) against the starter catalogue, prints
what the model was shown for each call (results, one validation error, one timeout),
and stops everything it started.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

from executor.launch import RedisServer, WorkerProcess
from executor.settings import Settings

__all__ = ["run_demo"]

_SCRIPT: list[Any] = [
    [("get_today_date", {}), ("search", {"query": "red-headed league pawnbroker", "limit": 2})],
    [("book_flight", {"flight_id": "BA117", "passenger": "Ada Lovelace"})],
    [("book_flight", {"flight_id": "next tuesday", "passenger": "Ada Lovelace"})],
    [("slow_report", {"seconds": 5})],
    "Booked BA117 for Ada Lovelace; the slow report did not finish in time.",
]


def run_demo(out: TextIO = sys.stdout) -> int:
    """Run the demo, printing to ``out``; returns the process exit code."""
    from agent_client import configure, remote_tool
    from agent_client.testing import ScriptedProvider, scripted_agent

    def say(line: str = "") -> None:
        print(line, file=out, flush=True)

    with tempfile.TemporaryDirectory(prefix="toolexec-demo-") as tmp:
        root = Path(tmp)
        with RedisServer(directory=root / "redis") as server:
            env = {
                "TOOLEXEC_BROKER_URL": server.url,
                "TOOLEXEC_DATA_DIR": str(root / "data"),
                "TOOLEXEC_HEARTBEAT_INTERVAL": "1",
            }
            say(f"started a private Redis server ({Path(server.binary).name}) on port {server.port}")
            workers = [
                WorkerProcess(name=f"demo{n}", pool="prefork", concurrency=2, env=env, log_dir=root / "logs")
                for n in (1, 2)
            ]
            try:
                for worker in workers:
                    worker.start()
                    info = worker.info
                    assert info is not None
                    say(f"started worker {info.hostname} (pid {info.pid}) serving: {', '.join(info.tools)}")
                client = configure(Settings.from_env(env))
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
                    say(f"  {result.tool_name or '?':<15} {text[:150]}{'...' if len(text) > 150 else ''}")
                say(f"\nagent answered: {envelope.text()}")
                say(f"agent run took {elapsed:.2f} s; agent-process threads now: {_thread_count()}")
                client.close()
            finally:
                for worker in workers:
                    worker.stop()
                say("stopped the workers and the Redis server")
    return 0


def _thread_count() -> int:
    import threading

    return threading.active_count()
