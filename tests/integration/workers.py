"""A real ``celery worker`` for one test module: named apart, logged apart, always stopped."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.conftest import PROJECT_ROOT
from toolexec import WorkerProcess


@contextlib.contextmanager
def module_worker(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    *,
    env: dict[str, str],
    kind: type[WorkerProcess] = WorkerProcess,
    **options: Any,
) -> Iterator[WorkerProcess]:
    """Start a ``kind`` named ``<name>-<8 hex>``, run from the project with its log in a
    fresh temporary folder, and stop it at exit; ``options`` go to ``kind`` (pool,
    concurrency, queues, loglevel: :class:`~toolexec.WorkerProcess`'s defaults otherwise)."""
    worker = kind(
        name=f"{name}-{uuid.uuid4().hex[:8]}",
        env=env,
        cwd=PROJECT_ROOT,
        log_dir=tmp_path_factory.mktemp(f"{name}-worker"),
        **options,
    )
    with worker:
        yield worker
