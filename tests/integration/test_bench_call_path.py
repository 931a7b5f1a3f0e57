"""bench.call_path, the count of modules one plain call passes (docs/architecture.md):
it sees each side's stages of a real call, and no module of the other side."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def test_the_call_path_names_each_sides_stages_and_counts_them() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.call_path", "--calls", "2"],
        check=False,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    agent, worker = out.split("\nworker process:")[0], out.split("\nworker process:")[1]
    worker = worker.split("\nin all, by package:")[0]
    listed = {
        side: set(re.findall(r"^    ([\w.]+)", text, re.MULTILINE))
        for side, text in (("agent", agent), ("worker", worker))
    }

    # Each side's stages of a plain call: prepare, send, wait; take, run, reply.
    assert {
        "agent_client.remote",
        "agent_client.prepare",
        "agent_client.client",
        "agent_client.deadline",
        "agent_client._io.send",
        "agent_client._io.replies",
        "wire.message",
    } <= listed["agent"]
    assert {
        "executor.seams.transport",
        "executor.seams.request",
        "executor.seams.celery_tasks",
        "executor.task",
        "executor.runner",
        "executor.delivery",
    } <= listed["worker"]
    assert not any(name.startswith("executor.") for name in listed["agent"])
    assert not any(name.startswith("agent_client.") for name in listed["worker"])
    counts = re.search(r"agent_client\s+agent\s+(\d+)\s+worker\s+(\d+)", out)
    assert counts is not None
    assert int(counts[1]) == sum(1 for name in listed["agent"] if name.startswith("agent_client"))
