"""The doctor's security checks (docs/security.md): ``json-only``,
``transport-security``, ``signing``.

* ``json-only``: the worker app reads and writes JSON only, whatever its configuration
  comes from (``--app``, ``CELERY_CONFIG_MODULE``, ``celeryconfig``); building the app
  also gives the tools the worker registers, which the other checks use;
* ``transport-security``: every broker and Redis URL off the loopback interface has
  TLS or credentials of its own (:func:`url_problems`);
* ``signing``: ``TOOLEXEC_SIGNING_KEY`` is set when the broker is reachable beyond
  this machine.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

from toolexec.doctor.check import Check, failed, passed, shown
from wire.connect import sentinel_group
from wire.errors import ConfigurationError
from wire.models import ToolSpec
from wire.settings import Settings
from wire.signing import MAKE_KEY
from wire.urls import AMQP_SCHEMES, REDIS_SCHEMES, is_sentinel_url

__all__ = ["json_only", "signing", "transport_security", "url_problems"]

#: A visibility timeout above any hard limit, for building the app to read its configuration.
_UNBOUNDED = 2**62
_INSECURE_CERT_REQS = frozenset({"none", "cert_none", "optional", "cert_optional"})


# -- json-only ---------------------------------------------------------------------------


def json_only(
    settings: Settings, app: Any, local_specs: Iterable[ToolSpec] | None
) -> tuple[Check, list[ToolSpec]]:
    """The json-only check, and the tools the worker registers.

    Each step runs on its own, so a failure of one (a tool module that does not import,
    an app module that raises) is this check's finding and the others still get the
    tools that did register.
    """
    from executor.registry import registered_tools
    from executor.seams.app import create_app, import_tool_modules
    from executor.seams.lockdown import json_only_problems

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
    specs = (
        list(local_specs)
        if local_specs is not None
        else [d.spec for d in registered_tools().values()]
    )
    if errors:
        return failed(
            "json-only",
            f"cannot build the worker app to read its Celery configuration: {errors[0]}",
            fix=(
                "fix the error above (the tool modules and the app must import here), then run the "
                "doctor again"
            ),
        ), specs
    if problems:
        return failed(
            "json-only",
            "the worker app's Celery configuration allows more than JSON: " + ", ".join(problems),
            fix=(
                "remove these settings (a --config module, celeryconfig.py, app.conf.update): a "
                "pickled message runs code of its sender's choosing; workers refuse to start with "
                "them"
            ),
        ), specs
    return passed("json-only", "the worker app reads and writes JSON only"), specs


# -- transport-security -------------------------------------------------------------------


def _is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def url_problems(url: str, *, sentinel_master: str | None = None) -> list[str]:
    """What is unsafe about a broker or Redis URL.

    Off the loopback interface a URL needs TLS or credentials of its own: a Redis
    password, a RabbitMQ user other than ``guest`` (the well-known default, which kombu
    also uses when the URL names none). A ``rediss://`` URL must not turn the server
    certificate check off. A ``sentinel://`` URL is read whole: each of its Sentinels,
    and the TLS parameters that end it (``sentinel_master``: its group's name).
    """
    if is_sentinel_url(url):
        return _sentinel_problems(url, sentinel_master)
    parts = urlsplit(url)
    scheme = f"{parts.scheme}://"  # urlsplit lowercases the scheme
    if scheme in AMQP_SCHEMES:
        return _amqp_problems(parts)
    if scheme not in REDIS_SCHEMES or scheme == "unix://":  # a Unix socket is on this machine
        return []
    problems = []
    query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
    cert_reqs = unquote(query.get("ssl_cert_reqs", "required")).lower()
    if parts.scheme == "rediss" and cert_reqs in _INSECURE_CERT_REQS:
        problems.append(f"ssl_cert_reqs={cert_reqs} turns the server certificate check off")
    if (
        not _is_loopback(parts.hostname or "localhost")
        and parts.scheme != "rediss"
        and not parts.password
    ):
        problems.append(
            f"{parts.hostname} is off the loopback interface, and the URL has neither TLS nor a "
            "password"
        )
    return problems


def _sentinel_problems(url: str, master: str | None) -> list[str]:
    group = sentinel_group(url, master or "?")
    assert group is not None  # a sentinel:// URL
    problems = []
    cert_reqs = (group.tls or {}).get("ssl_cert_reqs", "required")
    if group.tls is not None and cert_reqs in _INSECURE_CERT_REQS:
        problems.append(f"ssl_cert_reqs={cert_reqs} turns the server certificate check off")
    away = _away(url, master)
    if away and group.tls is None and not group.password:
        problems.append(
            f"{', '.join(away)} {'is' if len(away) == 1 else 'are'} off the loopback interface, "
            "and the URL has neither TLS nor a password"
        )
    return problems


def _away(url: str, sentinel_master: str | None) -> list[str]:
    """The hosts of ``url`` off the loopback interface: every Sentinel of a ``sentinel://``
    URL, else its one host."""
    group = sentinel_group(url, sentinel_master or "?")
    hosts = [h for h, _ in group.sentinels] if group else [urlsplit(url).hostname or "localhost"]
    return [host for host in hosts if not _is_loopback(host)]


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


def transport_security(settings: Settings) -> Check:
    """The transport-security check: :func:`url_problems` of the broker and Redis URLs."""
    urls = {"TOOLEXEC_BROKER_URL": settings.broker_url, "TOOLEXEC_REDIS_URL": settings.redis_url}
    found = [
        f"{name} ({shown(url)}): {problem}"
        for name, url in urls.items()
        for problem in url_problems(url, sentinel_master=settings.sentinel_master)
    ]
    if found:
        return failed(
            "transport-security",
            "; ".join(found),
            fix=(
                "use rediss:// with ssl_cert_reqs=required and ssl_ca_certs=<your CA>, and an ACL "
                "user with a password (docs/security.md); for RabbitMQ, amqps:// and a user of its "
                "own, not guest; anyone who reaches an open broker can make workers run tools"
            ),
        )
    return passed(
        "transport-security",
        "every broker and Redis URL is on loopback, or has TLS or credentials of its own",
    )


# -- signing -----------------------------------------------------------------------------


def signing(settings: Settings) -> Check:
    """The signing check: calls are signed when the broker is beyond this machine."""
    away = _away(settings.broker_url, settings.sentinel_master)
    host = ", ".join(away)
    if settings.broker_url.startswith("unix://") or not away:
        state = "on" if settings.signing_key is not None else "off"
        return passed("signing", f"the broker is on this machine; signing is {state}")
    if settings.signing_key is None:
        return failed(
            "signing",
            f"workers take calls from {host}, beyond this machine, and TOOLEXEC_SIGNING_KEY is not "
            "set: anything that can write to a queue can make them run a tool",
            fix=f"set the same TOOLEXEC_SIGNING_KEY on every worker and client ({MAKE_KEY})",
        )
    return passed("signing", f"the broker is {host}; calls are signed")
