"""``toolexec worker``: the ``celery worker`` command it runs, with the project's defaults.

``toolexec worker`` (:func:`run_worker`) replaces itself (``exec``) with::

    python -m celery -A executor worker --without-gossip --without-mingle -P POOL
        [-c N] [-Q QUEUES] [-n NAME] [-l LEVEL] [EXTRA...]

so the worker keeps the PID a supervisor started and gets its signals. Defaults:

* no ``-E``: task events as ``TOOLEXEC_TASK_EVENTS`` says (:mod:`executor.seams.events`):
  by default none until a monitor turns them on (Flower does), ``on`` from the start;
* ``--without-gossip --without-mingle``: toolexec uses neither Celery's worker-to-worker
  event subscription nor its start-up sync of revoked tasks, and both cost broker
  traffic that grows with the number of workers; Celery's own worker heartbeat events
  stay on, for Flower, and with them the event dispatcher that a monitor's
  ``enable_events`` turns task events on in;
* ``-P prefork``, Celery's concurrency (one process per CPU), every queue a registered
  tool names plus ``default``, and Celery's log level (WARNING), unless given.

``--pool asyncio`` is ``-P custom`` with ``CELERY_CUSTOM_WORKER_POOL`` naming toolexec's
asyncio pool (:func:`toolexec.worker_process.pool_env`); ``--metrics-port P`` is
``TOOLEXEC_METRICS_PORT=P`` in the worker's environment, ``--metrics-host H``
``TOOLEXEC_METRICS_HOST=H`` and ``--log-format json`` ``TOOLEXEC_LOG_FORMAT=json``.
``celery -A executor worker`` works as before; this is a shorter way to the same worker.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from toolexec.commands.exits import CommandFailed, ExitCode
from toolexec.worker_process import Pool, pool_env
from wire.settings import ENVIRONMENT_VARIABLES, Settings

__all__ = ["LOG_LEVELS", "POOLS", "check_tool_modules", "run_worker", "worker_argv", "worker_env"]

#: ``--pool`` choices.
POOLS: tuple[Pool, ...] = ("prefork", "threads", "solo", "asyncio")
#: ``--loglevel`` choices (Celery's).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def run_worker(
    *,
    queues: Sequence[str],
    concurrency: int | None,
    pool: Pool,
    metrics_port: int | None,
    metrics_host: str | None,
    log_format: str | None,
    loglevel: str | None,
    hostname: str | None,
    celery_args: Sequence[str],
) -> NoReturn:
    """Run ``toolexec worker``: check the options, then become the ``celery worker`` (same PID).

    ``queues`` are the ``-Q`` words as given: comma-separated, repeated, or both.

    Raises:
        CommandFailed: A bad ``--loglevel`` (exit code 2), or a tool module that is not
            found (8).
        ConfigurationError: The worker's ``TOOLEXEC_*`` settings do not parse (exit code 8).
    """
    if loglevel is not None and loglevel.upper() not in LOG_LEVELS:
        raise CommandFailed(
            f"--loglevel must be one of {', '.join(LOG_LEVELS)}, not {loglevel!r}",
            ExitCode.BAD_ARGUMENTS,
        )
    split = [q.strip() for word in queues for q in word.split(",") if q.strip()]
    env = worker_env(
        os.environ,
        pool=pool,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        log_format=log_format,
    )
    check_tool_modules(Settings.from_env(env), Path.cwd())
    argv = worker_argv(
        pool=pool,
        concurrency=concurrency,
        queues=split,
        name=hostname,
        loglevel=loglevel,
        extra=celery_args,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, env)


def worker_argv(
    *,
    pool: Pool = "prefork",
    concurrency: int | None = None,
    queues: Sequence[str] = (),
    name: str | None = None,
    loglevel: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The ``celery worker`` command line ``toolexec worker`` runs (module docstring)."""
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "executor",
        "worker",
        "--without-gossip",
        "--without-mingle",
        "-P",
        "custom" if pool == "asyncio" else pool,
    ]
    if concurrency is not None:
        argv += ["-c", str(concurrency)]
    if queues:
        argv += ["-Q", ",".join(queues)]
    if name:
        argv += ["-n", name]
    if loglevel:
        argv += ["-l", loglevel.upper()]
    return argv + list(extra)


def worker_env(
    environ: Mapping[str, str],
    *,
    pool: Pool,
    metrics_port: int | None,
    metrics_host: str | None = None,
    log_format: str | None = None,
) -> dict[str, str]:
    """The worker's environment: ``environ`` with the pool's variables and those of
    ``--metrics-port``, ``--metrics-host`` and ``--log-format`` (when given).

    Raises:
        ConfigurationError: The resulting ``TOOLEXEC_*`` settings do not parse (exit code 8).
    """
    env = {**environ, **pool_env(pool)}
    for field, value in (
        ("metrics_port", metrics_port),
        ("metrics_host", metrics_host),
        ("log_format", log_format),
    ):
        if value is not None:
            env[ENVIRONMENT_VARIABLES[field]] = str(value)
    Settings.from_env(env)  # ConfigurationError: main() prints it on one line
    return env


def check_tool_modules(settings: Settings, cwd: Path) -> None:
    """Fail on one line when a tool module cannot be found (the worker would not start).

    Only finds each module (its parent packages are imported); the worker imports it.

    Raises:
        CommandFailed: A module in ``TOOLEXEC_TOOL_MODULES`` is not found (exit code 8).
    """
    path = str(cwd)
    added = path not in sys.path
    if added:  # Celery imports tool modules relative to the worker's directory too
        sys.path.insert(0, path)
    try:
        for module in settings.tool_modules:
            try:
                found = importlib.util.find_spec(module)
            except (ImportError, ValueError):
                found = None
            if found is None:
                raise CommandFailed(
                    f"TOOLEXEC_TOOL_MODULES names {module!r}, which cannot be imported from {path}",
                    ExitCode.BAD_SETTINGS,
                )
    finally:
        if added:
            sys.path.remove(path)
