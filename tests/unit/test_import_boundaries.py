"""Three homes: the wire contract imports neither side; the sides import only the wire;
ops may import everything; nothing imports ops; the agent process loads no worker code,
and no framework until an adapter is asked for; on the worker only the Celery seams
(and the pools) import Celery, kombu or billiard; the agent's machinery (``agent_client._io``)
imports nothing of the public layer above it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("wire", "executor", "agent_client", "tasks", "toolexec")

#: package -> the project packages it may import (besides itself).
ALLOWED: dict[str, set[str]] = {
    "wire": set(),
    "executor": {"wire"},
    "tasks": {"executor", "wire"},
    "agent_client": {"wire"},
    "toolexec": {"wire", "executor", "agent_client", "tasks"},
}


def imported_roots(path: Path) -> set[str]:
    """The top-level packages a file imports, at module level or inside functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def imported_packages(path: Path) -> set[str]:
    """The project packages a file imports, at module level or inside functions."""
    return imported_roots(path) & set(PACKAGES)


def test_the_checker_sees_both_import_forms(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import executor.task\nfrom wire import keys\ndef f():\n    from toolexec import cli\n"
    )

    assert imported_packages(sample) == {"executor", "wire", "toolexec"}


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_imports_only_what_its_home_may(package: str) -> None:
    offending = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        wrong = imported_packages(path) - ALLOWED[package] - {package}
        if wrong:
            offending[path.relative_to(ROOT).as_posix()] = sorted(wrong)

    assert offending == {}


#: Celery and the libraries under it.
CELERY_LIBRARIES = {"celery", "kombu", "billiard"}
#: The worker's files that may import them: the seams that plug into their hooks, the
#: pools, limits.py (billiard's ``terminate_handler_fired``: its own SIGTERM, not a
#: tool's ``SystemExit``), and the package's ``__init__`` (the type of its lazy ``app``,
#: imported for type checking only).
CELERY_HOMES = ("executor/seams/", "executor/pools/", "executor/limits.py", "executor/__init__.py")


def test_only_the_workers_celery_seams_and_pools_import_celery_kombu_or_billiard() -> None:
    offending = {}
    for path in sorted((ROOT / "executor").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        found = imported_roots(path) & CELERY_LIBRARIES
        if found and not name.startswith(CELERY_HOMES):
            offending[name] = sorted(found)

    assert offending == {}
    assert imported_roots(ROOT / "executor" / "seams" / "app.py") & CELERY_LIBRARIES == {
        "celery",
        "kombu",
    }


#: Worker code and Celery: the agent process never needs them.
WORKER_SIDE = ("celery", "kombu", "billiard", "executor", "tasks", "toolexec")
#: Every framework an adapter speaks to: each is an optional extra, imported only when asked for.
FRAMEWORKS = ("lazybridge", "locus", "agents", "langchain_core", "langgraph", "pydantic_ai", "mcp")

#: agent_client modules left out of the walk, each because it imports its extra by design.
OPTIONAL_MODULES = {
    "agent_client.testing": (
        "the LazyBridge extra's scripted agents: it subclasses LazyBridge's provider"
    ),
    "agent_client._io.amqp_lane": (
        "the RabbitMQ lane: kombu's AMQP client, imported only for an amqp:// broker"
    ),
}


def _loaded_after(
    statement: str, packages: tuple[str, ...] = (*WORKER_SIDE, "lazybridge")
) -> list[str]:
    """The modules of ``packages`` a fresh interpreter has loaded after running ``statement``."""
    code = (
        f"import sys\n{statement}\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        f"{packages!r})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=ROOT,
    )
    return result.stdout.split()


def test_the_agent_process_loads_no_worker_module_no_celery_and_no_kombu() -> None:
    loaded = _loaded_after(
        "import agent_client\n"
        "from agent_client import client, prepare, deadline, remote, catalog\n"
        "from agent_client._io import loop, send, redis_lane, replies, watchdog"
    )

    assert loaded == []


#: Imports every agent_client module but the frameworks' own and OPTIONAL_MODULES, prints
#: what it imported, then drives the remote_tool() machinery with no Redis to reach.
_EVERY_CORE_MODULE_IN_USE = f"""
import importlib, pkgutil
import agent_client
skipped = {sorted(OPTIONAL_MODULES)!r}
walked = [
    m.name for m in pkgutil.walk_packages(agent_client.__path__, "agent_client.")
    if not m.name.startswith("agent_client.frameworks.") and m.name not in skipped
]
for name in walked:
    importlib.import_module(name)
print("\\n".join("walked:" + name for name in walked))

from agent_client import (
    BrokerUnavailable, RemoteTool, ToolArgumentsInvalid, ToolClient, remote_tool, remote_tools,
)
from wire.models import ToolSpec
from wire.settings import Settings

nowhere = "redis://127.0.0.1:1/0"  # nothing listens: every read fails at once
client = ToolClient(Settings(broker_url=nowhere, redis_url=nowhere))
for build in (lambda: remote_tool("search", client=client), lambda: remote_tools(client=client)):
    try:
        build()
    except BrokerUnavailable:
        pass
spec = ToolSpec(
    name="search", description="Search.",
    parameters={{
        "type": "object", "properties": {{"query": {{"type": "string"}}}}, "required": ["query"]
    }},
)
search = RemoteTool(spec, client=client, timeout=5)
search.to_openai_schema(), search.to_anthropic_schema(), search.effective_timeout(framework=3)
try:
    search.invoke_sync({{"query": 1}})
except ToolArgumentsInvalid:
    pass
client.close()
"""


def test_every_core_agent_module_in_use_loads_no_framework_and_no_worker_code() -> None:
    loaded = _loaded_after(_EVERY_CORE_MODULE_IN_USE, (*WORKER_SIDE, *FRAMEWORKS))

    walked = {name.removeprefix("walked:") for name in loaded if name.startswith("walked:")}
    assert {
        "agent_client.remote",
        "agent_client.catalog",
        "agent_client.frameworks",
        "agent_client._io.send",
    } <= walked
    assert walked == _core_modules()  # the walk found every module of the package
    assert [name for name in loaded if not name.startswith("walked:")] == []


def _core_modules() -> set[str]:
    """Every agent_client module by its file, less the frameworks' own and OPTIONAL_MODULES."""
    names = set()
    for path in (ROOT / "agent_client").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if (
            name != "agent_client"
            and not name.startswith("agent_client.frameworks.")
            and name not in OPTIONAL_MODULES
        ):
            names.add(name)
    return names


def test_the_modules_left_out_of_the_walk_load_no_other_framework_and_no_worker_code() -> None:
    assert (
        _loaded_after(
            "import agent_client._io.amqp_lane",
            (*FRAMEWORKS, "celery", "executor", "tasks", "toolexec"),
        )
        == []
    )
    assert _loaded_after("import agent_client.testing", (*WORKER_SIDE, *FRAMEWORKS)) == sorted(
        _loaded_after("import lazybridge", (*WORKER_SIDE, *FRAMEWORKS))
    )


def test_the_wire_contract_loads_neither_side() -> None:
    assert _loaded_after("import wire, wire.message, wire.scripts, wire.formats, wire.keys") == []


#: What the agent's machinery may import of agent_client: itself, and the error tree
#: (which imports only the wire), whose errors it settles futures with.
MACHINERY = "agent_client._io"
MACHINERY_MAY_IMPORT = (MACHINERY, "agent_client.errors")


def agent_modules_imported(path: Path, package: str) -> set[str]:
    """The agent_client modules a file of ``package`` imports, by full name (relative
    imports resolved; ``from agent_client import x`` counted as ``agent_client.x``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            if base in ("agent_client", MACHINERY):  # a package: what it names are its modules
                found.update(f"{base}.{alias.name}" for alias in node.names)
            else:
                found.add(base)
    return {name for name in found if name.split(".")[0] == "agent_client"}


def test_the_checker_resolves_relative_and_package_imports(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from . import link\nfrom ..remote import RemoteTool\nfrom agent_client import errors\n"
    )

    assert agent_modules_imported(sample, MACHINERY) == {
        "agent_client._io.link",
        "agent_client.remote",
        "agent_client.errors",
    }


def test_the_agents_machinery_imports_nothing_of_the_public_layer_above_it() -> None:
    upward = {}
    for path in sorted((ROOT / "agent_client" / "_io").rglob("*.py")):
        package = ".".join(path.relative_to(ROOT).parent.parts)
        wrong = {
            name
            for name in agent_modules_imported(path, package)
            if not any(name == m or name.startswith(f"{m}.") for m in MACHINERY_MAY_IMPORT)
        }
        if wrong:
            upward[path.relative_to(ROOT).as_posix()] = sorted(wrong)

    assert upward == {}


def executor_modules_imported(path: Path) -> set[str]:
    """The executor modules a file imports, by full name (``from executor import x``
    counted as ``executor.x``), at module level or inside functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module in ("executor", "executor.seams"):
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            else:
                found.add(node.module)
    return {name for name in found if name.split(".")[0] == "executor"}


def test_the_call_steps_import_no_seam_and_each_calls_cancel_imports_nothing_of_the_worker() -> (
    None
):
    # Celery at the edge: the call's steps below it know no request and no channel; and
    # each call's cancel is the bottom the runner and the limits stand on.
    steps = executor_modules_imported(ROOT / "executor" / "task.py")
    below = executor_modules_imported(ROOT / "executor" / "cancel_state.py")

    assert {name for name in steps if name.startswith("executor.seams")} == set()
    assert "executor.cancel_state" in steps  # the checker reads this file's imports
    assert below == set()
