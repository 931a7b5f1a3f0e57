"""No import circles among the product's modules.

Every import counts: at module level, inside a function, and under ``TYPE_CHECKING``. A
circle broken only at run time by an import inside a function still ties its modules:
none of them can be read, tested or moved without the others.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("wire", "executor", "agent_client", "tasks", "toolexec")


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The project modules ``path`` (module ``name``) imports, in any place of it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # ``from package import module`` imports the module; else a name of ``base``.
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {module for module in found if module in modules and module != name}


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """module -> the project modules it imports, for every module of ``packages`` under ``root``."""
    paths = {
        _module_name(p, root): p
        for package in packages
        for p in sorted((root / package).rglob("*.py"))
    }
    modules = set(paths)
    return {name: _imports(path, name, modules) for name, path in paths.items()}


def circle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of ``graph`` (its modules, the first again at the end), or [] if none."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return []


def test_the_checker_finds_a_circle_closed_inside_a_function_or_for_types_only(
    tmp_path: Path,
) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import thing\n")
    (package / "b.py").write_text("def thing():\n    from pkg import c\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n"
    )
    (package / "d.py").write_text("import pkg.a\n")

    graph = import_graph(tmp_path, ("pkg",))

    assert graph["pkg.d"] == {"pkg.a"}
    assert sorted(circle(graph)[:-1]) == ["pkg.a", "pkg.b", "pkg.c"]
    (package / "c.py").write_text("")
    assert circle(import_graph(tmp_path, ("pkg",))) == []


def test_the_product_has_no_import_circle() -> None:
    found = circle(import_graph(ROOT, PACKAGES))

    assert found == [], "an import circle: " + " -> ".join(found)
