"""Each package's __all__ is exactly its public names (like httpx's test_exported_members)."""

from __future__ import annotations

import types
import typing

import pytest

import agent_client
import agent_client.frameworks
import executor
import tasks
import toolexec
import wire

#: Every package with a public surface of its own (STYLE.md: an explicit, grouped __all__).
PACKAGES = [wire, executor, agent_client, agent_client.frameworks, tasks, toolexec]

#: Names that typing machinery puts in a namespace; not part of any public surface.
TYPING_HELPERS = {"annotations", "TYPE_CHECKING"}


def public_names(module: types.ModuleType) -> set[str]:
    """Names in the namespace not starting with '_', less submodules and typing helpers."""
    names = set()
    for name in dir(module):
        value = vars(module).get(name)
        if name.startswith("_") or name in TYPING_HELPERS or isinstance(value, types.ModuleType):
            continue
        if getattr(value, "__module__", None) == "typing" and getattr(typing, name, None) is value:
            continue  # e.g. `from typing import Any` in an __init__
        names.add(name)
    return names


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_all_is_exactly_the_public_names_in_the_package_namespace(
    package: types.ModuleType,
) -> None:
    exported = set(package.__all__)
    lazy = {"app"} if package is executor else set()  # built on first access by module __getattr__

    assert exported - lazy == public_names(package) - lazy
    assert lazy <= exported


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_all_lists_each_name_once(package: types.ModuleType) -> None:
    assert len(package.__all__) == len(set(package.__all__))


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_every_exported_name_resolves(package: types.ModuleType) -> None:
    for name in package.__all__:
        if package is executor and name == "app":
            # Resolving it builds the Celery app; only check that the lazy hook exists.
            assert callable(vars(executor)["__getattr__"])
            continue
        assert getattr(package, name) is not None, name


def test_an_unknown_attribute_of_executor_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module 'executor' has no attribute 'nonexistent'"):
        executor.nonexistent  # noqa: B018
