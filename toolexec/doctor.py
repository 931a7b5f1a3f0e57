"""``toolexec doctor``: check a deployment against docs/security.md and say what to fix.

:func:`run_checks` reads the settings, the worker app's Celery configuration and the
Redis the settings name, and returns one :class:`Check` per rule, each with its own
finding (one that cannot be checked fails, saying why, and the others still run):

* ``json-only``: the worker app reads and writes JSON only, whatever its configuration
  comes from (``--app``, ``CELERY_CONFIG_MODULE``, ``celeryconfig``);
* ``ttls``: no ``toolexec:*`` key but the catalog lives without a TTL (a sample of up
  to ``sample`` keys, read with ``SCAN`` and ``TTL``); the TTL settings are positive by
  construction (:class:`~wire.settings.Settings` refuses others);
* ``visibility-timeout``: above every tool's hard limit plus Celery's margin
  (:data:`wire.message.CELERY_LIMIT_MARGIN`), the tools of this worker and
  those in the catalog;
* ``transport-security``: every broker and Redis URL off the loopback interface has
  TLS or credentials of its own (a Redis password; a RabbitMQ user other than
  ``guest``), and no ``rediss://`` URL turns certificate checks off;
* ``persistence``: Redis keeps an append-only file when idempotent tools are registered
  (their stored outcomes are what stops a repeated booking), read with ``INFO
  persistence`` (``CONFIG GET`` if that is refused);
* ``signing``: ``TOOLEXEC_SIGNING_KEY`` is set when the broker is reachable beyond
  this machine.

:func:`main` prints them as a table (or ``--json``) and exits 1 when one fails; run it
with ``toolexec doctor`` or ``python -m toolexec.doctor``.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

import pydantic
import redis

from toolexec.commands.exits import ExitCode
from wire import keys
from wire.errors import ConfigurationError
from wire.message import CELERY_LIMIT_MARGIN
from wire.models import ToolSpec
from wire.redis_errors import explain
from wire.settings import ENVIRONMENT_VARIABLES, Settings

__all__ = ["Check", "main", "run_checks", "url_problems"]

#: Keys under ``toolexec:`` that live without a TTL by design.
_NO_TTL = frozenset({keys.CATALOG, keys.WORKERS})
#: A visibility timeout above any hard limit, for building the app to read its configuration.
_UNBOUNDED = 2**62
_AMQP_SCHEMES = frozenset({"amqp", "amqps", "pyamqp"})
_INSECURE_CERT_REQS = frozenset({"none", "cert_none", "optional", "cert_optional"})


@dataclass(frozen=True, kw_only=True)
class Check:
    """One rule of a deployment and how it fares.

    Attributes:
        name: The rule (``json-only``, ``ttls``, ...).
        ok: Whether the deployment follows it; False also when it could not be checked.
        message: What was found.
        fix: What to change; empty when ``ok``.
    """

    name: str
    ok: bool
    message: str
    fix: str = ""


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
    redis_client = client or redis.Redis.from_url(settings.redis_url, socket_connect_timeout=3, socket_timeout=5)
    try:
        celery_check, specs = _worker_app(settings, app, local_specs)
        catalog, catalog_error = _catalog(redis_client)
        every_spec = {spec.name: spec for spec in (*specs, *catalog)}.values()
        return [
            celery_check,
            _ttls(settings, redis_client, sample),
            _visibility(settings, every_spec),
            _transport(settings),
            _persistence(redis_client, every_spec, catalog_error),
            _signing(settings),
        ]
    finally:
        if own_client:
            redis_client.close()


# -- json-only ---------------------------------------------------------------------------


def _worker_app(settings: Settings, app: Any, local_specs: Iterable[ToolSpec] | None) -> tuple[Check, list[ToolSpec]]:
    """The json-only check, and the tools the worker registers.

    Each step runs on its own, so a failure of one (a tool module that does not import,
    an app module that raises) is this check's finding and the others still get the
    tools that did register.
    """
    from executor.celery_app import create_app, import_tool_modules
    from executor.lockdown import json_only_problems
    from executor.registry import registered_tools

    errors: list[str] = []
    problems: list[str] = []
    if local_specs is None:
        try:
            import_tool_modules(settings)
        except ConfigurationError as exc:
            errors.append(str(exc))
    if not errors:
        try:
            if app is None:
                # create_app also refuses a visibility timeout at or below a hard limit:
                # that is the visibility-timeout check's finding, not a reason this one
                # cannot read the Celery configuration.
                app = create_app(settings.model_copy(update={"visibility_timeout": _UNBOUNDED}))
            elif isinstance(app, str):
                from celery.app.utils import find_app

                app = find_app(app)
            problems = json_only_problems(app.conf)
        except Exception as exc:  # noqa: BLE001 - a user's app module may raise anything: report it
            errors.append(str(exc) or type(exc).__name__)
    specs = list(local_specs) if local_specs is not None else [d.spec for d in registered_tools().values()]
    if errors:
        return (
            Check(
                name="json-only", ok=False,
                message=f"cannot build the worker app to read its Celery configuration: {errors[0]}",
                fix="fix the error above (the tool modules and the app must import here), then run the doctor again",
            ),
            specs,
        )  # fmt: skip
    if problems:
        return (
            Check(
                name="json-only", ok=False,
                message="the worker app's Celery configuration allows more than JSON: " + ", ".join(problems),
                fix="remove these settings (a --config module, celeryconfig.py, app.conf.update): a pickled "
                "message runs code of its sender's choosing; workers refuse to start with them",
            ),
            specs,
        )  # fmt: skip
    return Check(name="json-only", ok=True, message="the worker app reads and writes JSON only"), specs


# -- ttls --------------------------------------------------------------------------------


def _ttls(settings: Settings, client: redis.Redis, sample: int) -> Check:
    # The TTL settings themselves are positive: Settings refuses anything else.
    set_to = ", ".join(
        f"{ENVIRONMENT_VARIABLES[name]}={getattr(settings, name):g}s" for name in ("reply_ttl", "outcome_ttl")
    )
    try:
        names: list[bytes] = []
        for name in client.scan_iter(match=f"{keys.PREFIX}*", count=1000):
            names.append(name)
            if len(names) >= sample:
                break
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.ttl(name)
        ttls = pipe.execute()
    except redis.RedisError as exc:
        return _unreachable("ttls", settings.redis_url, exc)
    forever = sorted(
        text for name, ttl in zip(names, ttls, strict=True)
        if ttl == -1 and (text := name.decode(errors="replace")) not in _NO_TTL
    )  # fmt: skip
    looked = f"{len(names)} toolexec keys looked at" + (f" (a sample of {sample})" if len(names) >= sample else "")
    if forever:
        shown = ", ".join(forever[:5]) + (f" and {len(forever) - 5} more" if len(forever) > 5 else "")
        return Check(
            name="ttls", ok=False,
            message=f"{len(forever)} of {looked} have no TTL: {shown}",
            fix="every toolexec key but the catalog expires: these were written by something else "
            "(an older version, a script); EXPIRE or DEL them",
        )  # fmt: skip
    return Check(name="ttls", ok=True, message=f"{set_to}; {looked}, none without a TTL but the catalog")


# -- visibility-timeout ----------------------------------------------------------------------


def _visibility(settings: Settings, specs: Iterable[ToolSpec]) -> Check:
    # Celery's hard limit is the tool's plus CELERY_LIMIT_MARGIN: the message stays
    # unacknowledged until that one has passed.
    limit = settings.visibility_timeout
    over = sorted(
        (spec.name, spec.hard_timeout)
        for spec in specs
        if spec.hard_timeout is not None and spec.hard_timeout + CELERY_LIMIT_MARGIN >= limit
    )
    if over:
        listed = ", ".join(f"{name} ({hard:g}s, Celery's limit {hard + CELERY_LIMIT_MARGIN:g}s)" for name, hard in over)
        longest = max(hard for _, hard in over) + CELERY_LIMIT_MARGIN
        return Check(
            name="visibility-timeout", ok=False,
            message=f"TOOLEXEC_VISIBILITY_TIMEOUT is {limit}s; hard limits that reach it: {listed}",
            fix=f"set TOOLEXEC_VISIBILITY_TIMEOUT above {longest:g}, or Redis redelivers calls that are "
            "still running (with ack emulation)",
        )  # fmt: skip
    return Check(
        name="visibility-timeout", ok=True,
        message=f"{limit}s, above every tool's hard limit plus Celery's {CELERY_LIMIT_MARGIN:g}s margin",
    )  # fmt: skip


# -- transport-security -------------------------------------------------------------------


def _is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _shown(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url.split("?", 1)[0]
    netloc = f"{parts.username or ''}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return parts._replace(netloc=netloc, query="").geturl()


def url_problems(url: str) -> list[str]:
    """What is unsafe about a broker or Redis URL.

    Off the loopback interface a URL needs TLS or credentials of its own: a Redis
    password, a RabbitMQ user other than ``guest`` (the well-known default, which kombu
    also uses when the URL names none). A ``rediss://`` URL must not turn the server
    certificate check off.
    """
    parts = urlsplit(url)
    if parts.scheme in _AMQP_SCHEMES:
        return _amqp_problems(parts)
    if parts.scheme not in ("redis", "rediss"):
        return []
    problems = []
    query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
    cert_reqs = unquote(query.get("ssl_cert_reqs", "required")).lower()
    if parts.scheme == "rediss" and cert_reqs in _INSECURE_CERT_REQS:
        problems.append(f"ssl_cert_reqs={cert_reqs} turns the server certificate check off")
    if not _is_loopback(parts.hostname or "localhost") and parts.scheme != "rediss" and not parts.password:
        problems.append(f"{parts.hostname} is off the loopback interface, and the URL has neither TLS nor a password")
    return problems


def _amqp_problems(parts: SplitResult) -> list[str]:
    host = parts.hostname or "localhost"
    if _is_loopback(host):
        return []
    user = unquote(parts.username or "guest")
    if user == "guest":
        guest = "the URL uses RabbitMQ's default guest account, whose password everyone knows"
        return [f"{host} is off the loopback interface, and {guest}"]
    if parts.scheme != "amqps" and not parts.password:
        return [f"{host} is off the loopback interface, and the URL has neither TLS nor a password"]
    return []


def _transport(settings: Settings) -> Check:
    urls = {"TOOLEXEC_BROKER_URL": settings.broker_url, "TOOLEXEC_REDIS_URL": settings.redis_url}
    found = [f"{name} ({_shown(url)}): {problem}" for name, url in urls.items() for problem in url_problems(url)]
    if found:
        return Check(
            name="transport-security", ok=False, message="; ".join(found),
            fix="use rediss:// with ssl_cert_reqs=required and ssl_ca_certs=<your CA>, and an ACL user "
            "with a password (docs/security.md); for RabbitMQ, amqps:// and a user of its own, not guest; "
            "anyone who reaches an open broker can make workers run tools",
        )  # fmt: skip
    return Check(
        name="transport-security", ok=True,
        message="every broker and Redis URL is on loopback, or has TLS or credentials of its own",
    )  # fmt: skip


# -- persistence -------------------------------------------------------------------------


def _persistence(client: redis.Redis, specs: Iterable[ToolSpec], catalog_error: str) -> Check:
    idempotent = sorted(spec.name for spec in specs if spec.idempotent)
    if not idempotent:
        if catalog_error:
            return Check(name="persistence", ok=False, message=f"cannot read the catalog: {catalog_error}",
                         fix="make Redis reachable with these settings, then run the doctor again")  # fmt: skip
        return Check(name="persistence", ok=True, message="no idempotent tools registered: nothing to keep")
    tools = ", ".join(idempotent)
    try:
        aof = _append_only(client)
    except redis.RedisError as exc:
        return Check(
            name="persistence", ok=False,
            message=f"idempotent tools ({tools}) are registered, and Redis does not say whether it keeps an "
            f"append-only file: {explain(exc)}",
            fix="run the doctor as a Redis user allowed CONFIG GET or INFO, or check that the server runs "
            "with appendonly yes",
        )  # fmt: skip
    if not aof:
        return Check(
            name="persistence", ok=False,
            message=f"idempotent tools ({tools}) are registered, and Redis keeps no append-only file: a restart "
            "forgets the stored outcomes that stop a repeated call from running again",
            fix="run Redis with appendonly yes (appendfsync everysec or always); in docker-compose, "
            "command: redis-server --appendonly yes, with a volume for /data",
        )  # fmt: skip
    return Check(name="persistence", ok=True, message=f"append-only file on; idempotent tools: {tools}")


def _append_only(client: redis.Redis) -> bool:
    # INFO persistence first: the documented ACL allows it (+info|persistence), and so do
    # managed Redis services that refuse CONFIG. An admin user may have CONFIG only.
    try:
        info = client.info("persistence")
        return str(info.get("aof_enabled", 0)) == "1"
    except redis.ResponseError:
        value = client.config_get("appendonly").get("appendonly")
        return str(value.decode() if isinstance(value, bytes) else value).lower() == "yes"


# -- signing -----------------------------------------------------------------------------


def _signing(settings: Settings) -> Check:
    host = urlsplit(settings.broker_url).hostname or "localhost"
    if settings.broker_url.startswith("unix://") or _is_loopback(host):
        state = "on" if settings.signing_key is not None else "off"
        return Check(name="signing", ok=True, message=f"the broker is on this machine; signing is {state}")
    if settings.signing_key is None:
        return Check(
            name="signing", ok=False,
            message=f"workers take calls from {host}, beyond this machine, and TOOLEXEC_SIGNING_KEY is not set: "
            "anything that can write to a queue can make them run a tool",
            fix="set the same TOOLEXEC_SIGNING_KEY on every worker and client "
            "(python -c 'import secrets; print(secrets.token_hex(32))')",
        )  # fmt: skip
    return Check(name="signing", ok=True, message=f"the broker is {host}; calls are signed")


# -- helpers -----------------------------------------------------------------------------


def _catalog(client: redis.Redis) -> tuple[list[ToolSpec], str]:
    try:
        raw = client.hgetall(keys.CATALOG)
    except redis.RedisError as exc:
        return [], explain(exc)
    specs = []
    for value in raw.values():
        try:
            specs.append(ToolSpec.model_validate_json(value))
        except pydantic.ValidationError:
            continue
    return specs, ""


def _unreachable(name: str, url: str, exc: redis.RedisError) -> Check:
    return Check(
        name=name, ok=False, message=f"cannot read Redis at {_shown(url)}: {explain(exc)}",
        fix="make Redis reachable with these settings, then run the doctor again",
    )  # fmt: skip


# -- the command -------------------------------------------------------------------------


def _table(checks: Sequence[Check]) -> Any:
    from rich.table import Table

    table = Table(title="toolexec doctor", show_lines=True)
    table.add_column("check", no_wrap=True)
    table.add_column("", no_wrap=True)
    table.add_column("found")
    table.add_column("fix")
    for check in checks:
        table.add_row(check.name, "[green]ok[/]" if check.ok else "[red]FAIL[/]", check.message, check.fix)
    return table


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run the checks and print them; 0 when all pass, 1 when one fails, 8 for bad settings."""
    parser = argparse.ArgumentParser(prog="toolexec doctor", description="Check a toolexec deployment; say what to fix.")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.add_argument(
        "--app", default=None, metavar="MODULE[:ATTR]",
        help="the workers' Celery app, if not toolexec's own (what they pass to celery -A)",
    )  # fmt: skip
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


if __name__ == "__main__":
    raise SystemExit(main())
