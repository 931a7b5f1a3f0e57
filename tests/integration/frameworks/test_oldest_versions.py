"""Each adapter's tests again, against the oldest framework releases its extra allows.

The rest of the suite runs them against what the test extra installs, the newest
releases. Here ``oldest.oldest_versions`` puts the oldest allowed ones (the extras'
floors, resolved together by uv) in a directory of their own, and each framework's
test module runs again in a fresh ``pytest`` process with that directory first on
``PYTHONPATH``, after a check that the process imports exactly those versions. A
framework whose oldest allowed release is the one installed is not run twice: the
test says so by its pins.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.frameworks.oldest import ROOT, oldest_versions

#: Each adapter's test module, and the packages whose versions it tests.
MODULES = {
    "test_pydantic_ai.py": ("pydantic-ai-slim",),
    "test_lazybridge.py": ("lazybridge",),
    "test_locus.py": ("locus-sdk",),
    "test_langchain.py": ("langchain-core", "langchain", "langgraph"),
    "test_openai_agents.py": ("openai-agents",),
    "test_mcp.py": ("mcp",),
}


@pytest.fixture(scope="module")
def oldest(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The directory holding the oldest allowed frameworks, and their pins."""
    target = tmp_path_factory.mktemp("oldest-frameworks")
    return target, oldest_versions(target)


def in_oldest(target: Path, *command: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``python command...`` with the oldest frameworks first on its path."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")
    }  # not this run's xdist worker
    env["PYTHONPATH"] = os.pathsep.join([str(target), str(ROOT)])
    return subprocess.run(
        [sys.executable, *command],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize("module", list(MODULES))
def test_the_adapters_tests_pass_on_the_oldest_framework_versions_their_extras_allow(
    module: str, oldest: tuple[Path, dict[str, str]]
) -> None:
    target, pins = oldest
    tested = {name: pins[name] for name in MODULES[module] if name in pins}
    if not tested:
        # The oldest allowed release is the installed one, which the suite runs the module on.
        assert not set(MODULES[module]) & set(pins)
        return

    checked = in_oldest(
        target, "-m", "tests.integration.frameworks.oldest", json.dumps(pins), timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    run = in_oldest(
        target,
        "-m",
        "pytest",
        "-n",
        "0",
        "-q",
        "-p",
        "no:cacheprovider",
        f"tests/integration/frameworks/{module}",
        timeout=240,
    )
    assert run.returncode == 0, f"{module} on {tested}:\n{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
    assert " passed" in run.stdout.splitlines()[-1], run.stdout[-2000:]
