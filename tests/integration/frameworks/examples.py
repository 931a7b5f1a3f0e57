"""Run a framework example and read the output its docstring quotes."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def expected_output(example: Path) -> str:
    """The block after ``::`` in the example's docstring, unindented."""
    doc = ast.get_docstring(ast.parse(example.read_text())) or ""
    block = doc.split("::", 1)[1]
    return "\n".join(line.removeprefix("    ") for line in block.strip("\n").splitlines()).strip()


def assert_example_prints_its_docstring(
    name: str, env: dict[str, str], *, timeout: float = 60, without: Iterable[str] = ()
) -> None:
    """Run ``examples/<name>`` with ``env`` and compare its stdout with its docstring.

    Args:
        name: The example's file name.
        env: Variables added to this process's environment.
        timeout: Seconds the example may take.
        without: Variables of this process's environment the example must not see.
    """
    example = ROOT / "examples" / name
    kept = {k: v for k, v in os.environ.items() if k not in set(without)}
    run = subprocess.run(
        [sys.executable, str(example)],
        env={**kept, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == expected_output(example)
