"""Running the doctor: :func:`run_checks` in order, and :func:`main`, which prints them.

``toolexec doctor`` and ``python -m toolexec.doctor`` run :func:`main`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

import redis

from toolexec.commands.exits import ExitCode
from toolexec.doctor.check import Check
from toolexec.doctor.durability import (
    eviction,
    persistence,
    replica_acks,
    ttls,
    visibility_timeout,
)
from toolexec.doctor.fleet import catalog_specs, same_tools_per_queue
from toolexec.doctor.security import json_only, signing, transport_security
from toolexec.doctor.sentinels import sentinels
from wire.connect import sync_client
from wire.errors import ConfigurationError
from wire.models import ToolSpec
from wire.settings import Settings

__all__ = ["main", "run_checks"]


def run_checks(
    settings: Settings,
    *,
    app: Any = None,
    client: redis.Redis | None = None,
    local_specs: Iterable[ToolSpec] | None = None,
    sample: int = 10_000,
) -> list[Check]:
    """Check the deployment ``settings`` describe.

    Args:
        settings: The deployment's settings.
        app: The worker's Celery app, or where to find it (``module[:attribute]``, as
            ``celery -A`` takes it); built with ``create_app(settings)`` when omitted.
            Either way its configuration is read as the worker's is, a
            ``CELERY_CONFIG_MODULE`` (``celery --config``) or ``celeryconfig`` included.
        client: A client of ``settings.redis_url``; made (and closed) when omitted.
        local_specs: The tools the worker registers; read from the worker app's registry
            when omitted. The catalog in Redis adds the tools other workers publish.
        sample: At most this many ``toolexec:*`` keys are looked at for a TTL.
    """
    own_client = client is None
    redis_client = client or sync_client(
        settings.redis_url,
        master=settings.sentinel_master,
        socket_connect_timeout=3,
        socket_timeout=5,
    )
    try:
        celery_check, specs = json_only(settings, app, local_specs)
        catalog, catalog_error = catalog_specs(redis_client)
        every_spec = {spec.name: spec for spec in (*specs, *catalog)}.values()
        return [
            celery_check,
            ttls(settings, redis_client, sample),
            visibility_timeout(settings, every_spec),
            transport_security(settings),
            persistence(redis_client, every_spec, catalog_error),
            eviction(settings, redis_client),
            signing(settings),
            same_tools_per_queue(redis_client),
            sentinels(settings),
            replica_acks(settings, redis_client),
        ]
    finally:
        if own_client:
            redis_client.close()


def _table(checks: Sequence[Check]) -> Any:
    from rich.table import Table

    table = Table(title="toolexec doctor", show_lines=True)
    table.add_column("check", no_wrap=True)
    table.add_column("", no_wrap=True)
    table.add_column("found")
    table.add_column("fix")
    for check in checks:
        table.add_row(
            check.name, "[green]ok[/]" if check.ok else "[red]FAIL[/]", check.message, check.fix
        )
    return table


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run the checks and print them; 0 when all pass, 1 when one fails, 8 for bad settings."""
    parser = argparse.ArgumentParser(
        prog="toolexec doctor", description="Check a toolexec deployment; say what to fix."
    )
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.add_argument(
        "--app",
        default=None,
        metavar="MODULE[:ATTR]",
        help="the workers' Celery app, if not toolexec's own (what they pass to celery -A)",
    )
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env(environ)
    except ConfigurationError as exc:
        print(f"toolexec doctor: {exc}", file=sys.stderr)
        return ExitCode.BAD_SETTINGS
    checks = run_checks(settings, app=args.app)
    if args.json:
        print(json.dumps([asdict(check) for check in checks], indent=2))
    else:
        from rich.console import Console

        Console().print(_table(checks))
    return 0 if all(check.ok for check in checks) else 1
