"""What a worker checks and locks before it takes a message.

:class:`Lockdown` is a bootstep of the worker blueprint (``create_app`` adds it). It
runs once the worker's configuration is final, after every ``celeryd_init`` and
``worker_init`` handler and before the pool starts or a message is taken, and:

1. refuses to start unless every serializer setting is JSON (:func:`json_only_problems`):
   a pickled message runs code of its sender's choosing as it is decoded, and a user's
   Celery configuration (a ``--config`` module, ``app.conf.update``) could allow it;
2. unregisters every task but toolexec's two: Celery's built-ins (``celery.chain``,
   ``celery.backend_cleanup``, ...) and any ``@shared_task`` a tool module's imports
   brought in, so a message naming any other task is refused as unregistered
   (:func:`restrict_tasks`);
3. refuses to start when Redis refuses its credentials, fails its check of the server's
   certificate or refuses the worker's client certificate, instead of retrying forever
   (:func:`check_connections`), or evicts keys when full (:func:`check_eviction`); an
   unreachable Redis is still waited for;
4. keeps tool data out of Celery's own error logs of a failed task: the exception
   message of a task body or of a pool child's exit, in the record's arguments and in
   the ``data`` Celery attaches for custom handlers (:func:`withhold_message_bodies`).
   Messages the consumer refuses are dead-lettered without being logged
   (:mod:`executor.seams.consumer`).

A signed call's check is in :mod:`executor.seams.signatures`.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

import redis
from billiard.exceptions import Terminated, TimeLimitExceeded, WorkerLostError
from celery import bootsteps

from wire.connect import sync_client
from wire.errors import ConfigurationError
from wire.models import TASK_AT_LEAST_ONCE, TASK_AT_MOST_ONCE
from wire.redis_errors import explain, is_misconfiguration, tls_refusal
from wire.settings import Settings
from wire.urls import is_redis_url, is_tls_redis_url, without_password

__all__ = [
    # The bootstep
    "TOOLEXEC_TASKS",
    "Lockdown",
    "broker_ssl_options",
    "check_connections",
    "check_eviction",
    "eviction_policy",
    "check_json_only",
    "json_only_problems",
    "restrict_tasks",
    "withhold_message_bodies",
]

logger = logging.getLogger(__name__)

#: The only tasks a toolexec worker runs.
TOOLEXEC_TASKS = frozenset({TASK_AT_MOST_ONCE, TASK_AT_LEAST_ONCE})

_JSON = frozenset({"json", "application/json"})


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value) if isinstance(value, Iterable) else [value]


def json_only_problems(conf: Mapping[str, Any]) -> list[str]:
    """The serializer settings in ``conf`` that allow anything but JSON, as ``name=value``.

    ``result_accept_content`` may be None (Celery then uses ``accept_content``).
    """
    problems = []
    for setting in ("accept_content", "result_accept_content"):
        value = conf.get(setting)
        if setting == "result_accept_content" and value is None:
            continue
        accepted = _as_list(value)
        if not accepted or any(item not in _JSON for item in accepted):
            problems.append(f"{setting}={value!r}")
    for setting in ("task_serializer", "result_serializer", "event_serializer"):
        value = conf.get(setting)
        if value not in _JSON:
            problems.append(f"{setting}={value!r}")
    return problems


def check_json_only(conf: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigurationError` unless ``conf`` reads and writes JSON only."""
    problems = json_only_problems(conf)
    if problems:
        raise ConfigurationError(
            "toolexec workers read and write JSON only, but the Celery configuration sets "
            + ", ".join(problems)
            + ": a pickled message runs code of its sender's choosing when it is decoded, so "
            "anyone who can write to the broker could run anything on this worker. Remove "
            "these settings (from the --config module, celeryconfig.py or app.conf.update); "
            "toolexec sets JSON itself"
        )


def restrict_tasks(app: Any) -> list[str]:
    """Unregister every task of ``app`` but toolexec's two; return the names removed.

    That is Celery's built-ins, and any ``@shared_task`` a tool module's imports
    defined (Celery adds those to every app). A message naming a task that is not
    registered is then refused by the consumer's ``on_unknown_task``.
    """
    removed = sorted(name for name in app.tasks if name not in TOOLEXEC_TASKS)
    for name in removed:
        app.tasks.unregister(name)
    foreign = [name for name in removed if not name.startswith("celery.")]
    if foreign:
        logger.warning("not serving Celery tasks that are not toolexec's: %s", ", ".join(foreign))
    return removed


def check_connections(
    urls: Mapping[str, Any],
    *,
    timeout: float = 5.0,
    attempts: int = 3,
    sentinel_master: str | None = None,
) -> None:
    """Connect to each Redis URL; raise if it refuses the credentials or certificates.

    A refusal counts once it repeats ``attempts`` times, 0.2 s apart: a server closing
    connections as it restarts can look like one that refuses a client certificate.

    Args:
        urls: Setting name -> URL (other schemes are skipped).
        sentinel_master: The group a ``sentinel://`` URL names (its master is checked).
        timeout: Seconds for each connection and its PING.
        attempts: Connections tried before a refusal stops the worker.

    Raises:
        ConfigurationError: A server refused the password, the ACL user, its own TLS
            certificate's check or this client's certificate; the message names the
            setting and the cause. A server that cannot be reached is only logged:
            the worker waits for it.
    """
    for variable, url in urls.items():
        if not is_redis_url(url):
            continue
        shown = without_password(url)
        for attempt in range(1, attempts + 1):
            try:
                with sync_client(
                    url,
                    master=sentinel_master,
                    socket_connect_timeout=timeout,
                    socket_timeout=timeout,
                ) as client:
                    client.ping()
                    check_eviction(client, variable=variable, shown=shown)
                break
            except redis.RedisError as exc:
                reason = explain(exc) if is_misconfiguration(exc) else tls_refusal(url, str(exc))
                if reason is None:
                    logger.warning(
                        "%s (%s) cannot be reached yet: %s; the worker keeps trying",
                        variable,
                        shown,
                        explain(exc),
                    )
                    break
                if attempt == attempts:
                    raise ConfigurationError(f"{variable} ({shown}): {reason}") from None
                time.sleep(0.2)


#: The one ``maxmemory-policy`` toolexec can keep its promises on.
KEEPS_KEYS = "noeviction"


def check_eviction(client: redis.Redis, *, variable: str, shown: str) -> None:
    """Refuse a Redis that evicts keys when it is full (``maxmemory-policy``).

    An evicting Redis drops, to make room, the very records "nothing runs twice" rests
    on: a call's claim and key state, its sent marker, its holder record, a worker's
    heartbeat. Calls would run twice and live workers be taken for dead. Full and not
    evicting (``noeviction``), Redis refuses writes instead, which toolexec rides out.
    A Redis that will not say (neither ``INFO memory`` nor ``CONFIG GET`` allowed) is
    taken as it is, with a warning.

    Raises:
        ConfigurationError: The policy is anything but ``noeviction``.
    """
    try:
        policy = eviction_policy(client)
    except redis.ResponseError as exc:
        logger.warning(
            "%s (%s) does not say its maxmemory-policy (%s): toolexec needs noeviction, or "
            "calls may run twice once it is full",
            variable,
            shown,
            str(exc).split("\n", 1)[0][:200],
        )
        return
    if policy is not None and policy != KEEPS_KEYS:
        raise ConfigurationError(
            f"{variable} ({shown}): Redis evicts keys when it is full (maxmemory-policy {policy}), "
            "which drops the claims and holder records that keep calls from running twice; set "
            f"maxmemory-policy {KEEPS_KEYS} (CONFIG SET maxmemory-policy {KEEPS_KEYS}, or in "
            "redis.conf)"
        )


def eviction_policy(client: redis.Redis) -> str | None:
    """Redis' ``maxmemory-policy``: from ``INFO memory`` (which the documented ACL allows,
    as managed services do), else ``CONFIG GET``.

    Raises:
        redis.ResponseError: Redis allows neither.
    """
    try:
        policy = client.info("memory").get("maxmemory_policy")
    except redis.ResponseError:
        policy = client.config_get("maxmemory-policy").get("maxmemory-policy")
    return None if policy is None else str(policy)


def broker_ssl_options(broker_url: str) -> dict[str, Any] | None:
    """Celery's ``broker_use_ssl`` for ``broker_url``: verify the server on ``rediss://``.

    kombu connects to a ``rediss://`` URL that carries no ``ssl_*`` parameters without
    checking the server's certificate; redis-py checks it against the system's CAs.
    This makes the broker connection do what toolexec's own Redis clients do. A URL
    with ``ssl_*`` parameters keeps them (they replace these options).
    """
    if not is_tls_redis_url(broker_url):
        return None
    query = parse_qs(urlsplit(broker_url).query)
    if any(name.startswith("ssl_") for name in query):
        return None
    return {"ssl_cert_reqs": ssl.CERT_REQUIRED}


# -- message bodies stay out of Celery's error logs ----------------------------------

_WITHHELD = "<withheld: a message body may hold tool arguments>"
_WORKER_FAULTS = (WorkerLostError, TimeLimitExceeded, Terminated)


class _WithholdBodies(logging.Filter):
    """Rewrites Celery's log records that would print a message body or a tool's exception.

    The record keeps its level and its first line (what happened, the task name and
    id); the body, the message headers' reprs and exception messages are replaced by
    placeholders, and a traceback goes to a DEBUG record of its own.
    """

    def __init__(self, formats: Mapping[str, tuple[int, ...]]) -> None:
        super().__init__()
        self._formats = formats

    def filter(self, record: logging.LogRecord) -> bool:
        positions = self._formats.get(record.msg) if isinstance(record.msg, str) else None
        if positions is None:
            return True
        if isinstance(record.args, Mapping):  # celery.app.trace's dict-style records
            if record.args.get("name") not in TOOLEXEC_TASKS:
                return True
            record.args = _scrubbed(record.args)
            # The same context rides on the record as ``data`` for custom handlers (a
            # JSON formatter would print it whole).
            data = getattr(record, "data", None)
            if isinstance(data, Mapping):
                record.data = _scrubbed(data)
        elif isinstance(record.args, tuple):
            record.args = tuple(
                _withheld(value) if index in positions else value
                for index, value in enumerate(record.args)
            )
        if record.exc_info:
            logger.debug("traceback of: %s", record.msg.splitlines()[0], exc_info=record.exc_info)
            record.exc_info = None
            record.exc_text = None
        return True


#: The fields of celery.app.trace's context that can carry tool data: the exception's
#: repr and traceback (its message), the arguments' reprs (``argsrepr``/``kwargsrepr``
#: name the tool only in toolexec's messages, but a message without them is repr'd whole).
_CONTEXT_WITHHELD = ("traceback", "args", "kwargs")


def _scrubbed(context: Mapping[str, Any]) -> dict[str, Any]:
    scrubbed = dict(context)
    scrubbed["exc"] = _type_only(context.get("exc"))
    for field in _CONTEXT_WITHHELD:
        if field in scrubbed:
            scrubbed[field] = _WITHHELD
    return scrubbed


def _type_only(value: Any) -> str:
    # safe_repr(exc) is "Type('message', ...)": keep the type.
    text = str(value)
    return text.split("(", 1)[0] + "(<withheld>)" if "(" in text else "<withheld>"


def _withheld(value: Any) -> Any:
    if isinstance(value, _WORKER_FAULTS):  # billiard's own words: no tool data
        return value
    if isinstance(value, BaseException):
        return f"{type(value).__name__}(<withheld>)"
    return _WITHHELD


def withhold_message_bodies() -> None:
    """Install the filters on Celery's loggers that print tool data (idempotent)."""
    from celery.app import trace

    # Messages the consumer refuses are dead-lettered without their body being logged
    # (executor.seams.consumer); these are the records of a call that was taken.
    filters: dict[str, Mapping[str, tuple[int, ...]]] = {
        # A failure of the task body: its exception message may quote tool data.
        trace.logger.name: {trace.LOG_FAILURE.strip(): (), trace.LOG_INTERNAL_ERROR.strip(): ()},
        # The main process's report of a pool child's failure (a tool's SystemExit...).
        "celery.worker.request": {"Task handler raised error: %r": (0,)},
    }
    for name, formats in filters.items():
        target = logging.getLogger(name)
        if not any(isinstance(f, _WithholdBodies) for f in target.filters):
            target.addFilter(_WithholdBodies(formats))


class Lockdown(bootsteps.Step):  # type: ignore[misc]
    """Worker bootstep: JSON only, toolexec's tasks only, credentials that work."""

    label = "toolexec lockdown"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        app = parent.app
        settings: Settings | None = getattr(app, "toolexec_settings", None)
        check_json_only(app.conf)
        withhold_message_bodies()
        removed = restrict_tasks(app)
        logger.debug("unregistered the tasks that are not toolexec's: %s", ", ".join(removed))
        # The setting as given: Celery's broker_url is a sentinel:// URL's without its TLS.
        broker_url = settings.broker_url if settings is not None else app.conf.broker_url
        urls = {"TOOLEXEC_BROKER_URL": broker_url}
        if settings is not None and settings.redis_url != broker_url:
            urls["TOOLEXEC_REDIS_URL"] = settings.redis_url
        check_connections(
            urls, sentinel_master=settings.sentinel_master if settings is not None else None
        )
