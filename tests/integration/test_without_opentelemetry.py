"""OpenTelemetry is optional: without ``opentelemetry-api`` a call works on both sides.

The test environment has OpenTelemetry installed (the tracing tests need it), so this
test takes it away: a ``sitecustomize`` module, on ``PYTHONPATH`` ahead of everything,
makes every ``import opentelemetry...`` raise ``ImportError``, as on a machine without
the package. A real worker and an agent in a fresh interpreter both start with it; the
agent opens a span-less call, the worker runs it through its tracing hook
(:func:`executor.tracing.call_span`), and the result comes back.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from toolexec import WorkerProcess

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

#: Refuses every import of ``opentelemetry`` and its submodules, at interpreter start.
BLOCKER = '''
import sys


class _NoOpenTelemetry:
    """A meta path finder that makes the opentelemetry packages unimportable."""

    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"No module named {name!r} (taken away by the test)")
        return None


sys.meta_path.insert(0, _NoOpenTelemetry())
'''

#: The agent: a fresh interpreter that makes one call and prints what it got.
AGENT = textwrap.dedent(
    """
    import json, sys
    try:
        import opentelemetry  # noqa: F401
    except ImportError:
        importable = False
    else:
        importable = True
    from agent_client import ToolClient, remote_tool
    from wire.settings import Settings

    client = ToolClient(Settings.from_env())
    try:
        result = remote_tool("otel_absent_echo", client=client).invoke_sync(
            {"text": "no traces"}, timeout=30
        )
    finally:
        client.close()
    loaded = sorted(name for name in sys.modules if name.startswith("opentelemetry"))
    print(json.dumps({"opentelemetry": importable, "loaded": loaded, "result": result}))
    """
)


def test_a_call_works_with_opentelemetry_unimportable_in_the_agent_and_the_worker(
    settings_env: dict[str, str], tmp_path: Path
) -> None:
    assert importlib.util.find_spec("opentelemetry") is not None, "the blocker would prove nothing"
    blocker = tmp_path / "no-otel"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCKER)
    path = os.pathsep.join([str(blocker), str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {
        **settings_env,
        "TOOLEXEC_TOOL_MODULES": "tests.integration.otel_absent_tools",
        "PYTHONPATH": path,
    }
    worker = WorkerProcess(
        name=f"no-otel-{uuid.uuid4().hex[:8]}",
        pool="prefork",
        concurrency=1,
        queues=("no-otel",),
        env=env,
        cwd=ROOT,
        log_dir=tmp_path / "worker",
    )
    with worker:
        agent = subprocess.run(
            [sys.executable, "-c", AGENT],
            env={**os.environ, **env},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        children = worker.child_pids()
        log = worker.log_path.read_text()

    assert agent.returncode == 0, agent.stderr
    seen = json.loads(agent.stdout.strip().splitlines()[-1])
    assert seen["opentelemetry"] is False and seen["loaded"] == []
    result = seen["result"]
    assert result["text"] == "no traces"
    assert result["opentelemetry"] is False  # the worker's process could not import it either
    assert result["pid"] in children
    assert "Traceback" not in log
