"""What a doctor check finds: a :class:`Check`, passed or failed with a fix, and how it
shows a URL."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["REACH_REDIS", "Check", "cannot_read", "failed", "passed", "shown"]

#: The fix of a check that could not read Redis.
REACH_REDIS = "make Redis reachable with these settings, then run the doctor again"


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


def passed(name: str, message: str) -> Check:
    """The deployment follows rule ``name``; ``message`` says what was found."""
    return Check(name=name, ok=True, message=message)


def failed(name: str, message: str, fix: str) -> Check:
    """The deployment breaks rule ``name`` (or it could not be checked); ``fix`` says what to do."""
    return Check(name=name, ok=False, message=message, fix=fix)


def cannot_read(name: str, what: str, why: str) -> Check:
    """Rule ``name`` could not be checked: ``what`` could not be read from Redis, for ``why``."""
    return failed(name, f"cannot read {what}: {why}", REACH_REDIS)


def shown(url: str) -> str:
    """``url`` as a finding shows it: without its password and its query (each part of a
    ``sentinel://`` URL alike)."""
    if ";" in url:
        return ";".join(shown(part) for part in url.split(";"))
    parts = urlsplit(url)
    if parts.password is None:
        return url.split("?", 1)[0]
    netloc = f"{parts.username or ''}:***@{parts.hostname}" + (
        f":{parts.port}" if parts.port else ""
    )
    return parts._replace(netloc=netloc, query="").geturl()
