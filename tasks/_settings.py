"""The settings the tools read, built once per process.

Tools never read the environment themselves: they call :func:`settings`, which builds
:class:`wire.settings.Settings` from it on first use and keeps it. Tests replace
:func:`settings` (``monkeypatch.setattr(tasks._settings, "settings", ...)``); tool
modules therefore look it up through this module at call time, never by
``from tasks._settings import settings``.
"""

from __future__ import annotations

import functools
from pathlib import Path

from wire.settings import Settings

__all__ = ["data_dir", "settings"]


@functools.cache
def _from_env() -> Settings:
    return Settings.from_env()


def settings() -> Settings:
    """This process's settings, read from the environment once."""
    return _from_env()


def data_dir() -> Path:
    """Where tools keep their files (``Settings.data_dir``, ``~`` expanded)."""
    return Path(settings().data_dir).expanduser()
