"""agent_client may use the executor's pure data and configuration, never the worker's machinery."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import agent_client

#: The executor modules the agent side may import (pure data, configuration, key names).
ALLOWED = {"executor.protocol", "executor.settings", "executor.keys", "executor.message", "executor.errors"}

AGENT_MODULES = sorted(Path(agent_client.__file__).parent.glob("*.py"))


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports; ``from executor import keys`` counts as executor.keys."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names if node.module in ("executor", "tasks"))
    return found


def test_the_checker_sees_both_import_forms() -> None:
    assert len(AGENT_MODULES) > 5
    assert "executor.keys" in imported_modules(Path(agent_client.__file__).parent / "client.py")


def test_agent_client_imports_only_the_executors_data_and_configuration() -> None:
    offending = {}
    for path in AGENT_MODULES:
        wrong = {
            name for name in imported_modules(path)
            if (name.startswith("executor.") and name not in ALLOWED) or name == "tasks" or name.startswith("tasks.")
        }
        if wrong:
            offending[path.name] = sorted(wrong)

    assert offending == {}


def test_importing_agent_client_loads_no_celery_and_no_tools() -> None:
    code = (
        "import sys, agent_client\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('celery', 'tasks', 'lazybridge')"
        " or m in ('executor.task', 'executor.celery_app', 'executor.runner')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)

    assert result.stdout.strip() == "[]"
