"""The oldest framework versions the extras allow, put in front of this venv's.

The adapters are tested against the newest release of each framework (what the test
extra installs) and the oldest its extra allows. :func:`oldest_versions` asks uv for
the lowest versions of the framework packages that the extras' floors allow together
(``uv pip compile --resolution lowest-direct``: pip has no lowest resolution), and
installs those that differ from this venv's into a directory of their own
(``uv pip install --target``, without dependencies: everything else comes from this
venv). A process with that directory first on ``PYTHONPATH`` imports the old
frameworks and this venv's everything else; :func:`check` (``python -m
tests.integration.frameworks.oldest PINS``, run in such a process) makes sure it did,
and that every requirement among them holds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[3]

#: The extras of the framework adapters: each names its framework's oldest allowed release.
FRAMEWORK_EXTRAS = ("lazybridge", "locus", "openai-agents", "langchain", "pydantic-ai", "mcp")
#: Frameworks the adapter tests also run, from the test extra (LangChain's agent loop).
TEST_FRAMEWORKS = ("langgraph", "langchain")


def framework_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The requirements, with their floors, of the framework packages the adapters are
    tested with."""
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    wanted = [r for extra in FRAMEWORK_EXTRAS for r in extras[extra]]
    wanted += [
        r for r in extras["test"] if canonicalize_name(Requirement(r).name) in TEST_FRAMEWORKS
    ]
    return wanted


def lowest_pins(requirements: Iterable[str]) -> dict[str, str]:
    """Every package's version when the given requirements are at their lowest together."""
    resolved = subprocess.run(
        [
            _uv(),
            "pip",
            "compile",
            "--resolution",
            "lowest-direct",
            "--python",
            sys.executable,
            "--no-header",
            "--no-annotate",
            "--quiet",
            "-",
        ],
        input="\n".join(requirements),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if resolved.returncode != 0:
        raise RuntimeError(
            f"uv could not resolve the oldest framework versions:\n{resolved.stderr}"
        )
    pins: dict[str, str] = {}
    for line in resolved.stdout.splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            name, version = line.split(";")[0].strip().split("==")
            pins[str(canonicalize_name(name))] = version
    return pins


def oldest_versions(target: Path) -> dict[str, str]:
    """Install into ``target`` the oldest frameworks and what they need older; return their pins.

    A framework package is pinned where its oldest allowed version differs from this
    venv's; any other package only where the oldest frameworks need it older than this
    venv has it (``pydantic-graph`` pinned by ``pydantic-ai-slim``), not where the
    resolution merely found a newer release of it.
    """
    requirements = framework_requirements()
    direct = {str(canonicalize_name(Requirement(r).name)) for r in requirements}
    differing = {
        name: version
        for name, version in lowest_pins(requirements).items()
        if (have := _installed(name)) != version
        and (name in direct or have is None or Version(have) > Version(version))
    }
    if differing:
        installed = subprocess.run(
            [
                _uv(),
                "pip",
                "install",
                "--target",
                str(target),
                "--no-deps",
                "--python",
                sys.executable,
                "--quiet",
                *(f"{name}=={version}" for name, version in sorted(differing.items())),
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        if installed.returncode != 0:
            raise RuntimeError(
                f"uv could not install the oldest framework versions:\n{installed.stderr}"
            )
    return differing


def check(pins: Mapping[str, str]) -> list[str]:
    """What is wrong with this process's packages, given the pins it should import; [] if nothing.

    Each pinned package must be the version imported, and every requirement of a
    package pinned or depending on one must hold.
    """
    first: dict[str, metadata.Distribution] = {}
    for dist in metadata.distributions():  # in sys.path order: the first one is imported
        first.setdefault(str(canonicalize_name(dist.metadata["Name"])), dist)
    problems = [
        f"{name} is {first[name].version if name in first else 'missing'}, not the pinned {version}"
        for name, version in pins.items()
        if name not in first or first[name].version != version
    ]
    for name, dist in first.items():
        for text in dist.requires or ():
            requirement = Requirement(text)
            needed = str(canonicalize_name(requirement.name))
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            if name not in pins and needed not in pins:
                continue  # untouched by the pins: this venv's resolver checked it
            have = first.get(needed)
            if have is None or not requirement.specifier.contains(have.version, prereleases=True):
                problems.append(
                    f"{name} {dist.version} needs {text}; found {have.version if have else 'none'}"
                )
    return problems


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _uv() -> str:
    from uv import find_uv_bin

    return find_uv_bin()


if __name__ == "__main__":
    found = check(json.loads(sys.argv[1]))
    print("\n".join(found) or "ok")
    sys.exit(1 if found else 0)
