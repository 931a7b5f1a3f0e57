"""Settings: the one place that reads the environment.

Both sides build a :class:`Settings` with :meth:`Settings.from_env` and hand it down;
no other module reads ``os.environ``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from wire.connect import sentinel_group
from wire.errors import ConfigurationError
from wire.models import MAX_TIMEOUT
from wire.signing import MAKE_KEY, MIN_KEY_CHARS
from wire.urls import (
    AMQP_SCHEMES,
    BROKER_SCHEMES,
    REDIS_SCHEMES,
    is_redis_url,
    is_sentinel_url,
    without_password,
)

__all__ = ["ENVIRONMENT_VARIABLES", "MAX_REPLICA_ACKS", "Settings", "set_environment_variable"]

#: The most replicas ``TOOLEXEC_REPLICA_ACKS`` may ask for.
MAX_REPLICA_ACKS = 16


def set_environment_variable(name: str, value: str) -> None:
    """Set ``name`` in this process's environment, for a library that reads it and for children.

    The one write: ``prometheus_client`` takes its multiprocess directory from
    ``PROMETHEUS_MULTIPROC_DIR`` (:mod:`executor.metrics`). Kept here so that this
    module stays the only one that touches the environment.
    """
    os.environ[name] = value


def _default_data_dir() -> str:
    return str(Path.home() / ".toolexec")


class Settings(BaseModel):
    """Configuration shared by workers and agent clients.

    Attributes:
        broker_url: Where Celery messages go.
        redis_url: Redis for the catalog, replies and idempotency records.
        tool_modules: Modules a worker imports to register its tools.
        default_timeout: Deadline in seconds for a call when nothing else sets one;
            ``None`` means no deadline.
        heartbeat_interval: A dead worker leaves the catalog within this many seconds.
        reply_ttl: Seconds an undelivered reply is kept for its client.
        outcome_ttl: Seconds a stored idempotent outcome is kept.
        handle_ttl: Seconds a submitted call's state and outcome are kept for any process
            to attach to (``agent_client.attach``), counted from its last change.
        claim_margin: Seconds added to a claim's TTL beyond the deadline and hard limit.
        visibility_timeout: Seconds before Redis redelivers an unacknowledged message;
            must exceed every tool's hard limit. Only used with ``ack_emulation``.
        ack_emulation: Keep kombu's copy of each taken message until it is acknowledged,
            restored after ``visibility_timeout`` if its worker vanished. Off by default:
            the client notices a lost worker within seconds and sends its call again.
        max_argument_bytes: Largest JSON encoding of a call's arguments accepted.
        max_result_bytes: Largest JSON encoding of a tool's result accepted.
        max_deliveries: How many times an at-least-once call is run when the worker
            process running it dies each time; after the last, the call is
            dead-lettered and its callers get ``WorkerLost`` naming the attempts.
        data_dir: Where tools keep files (the starter tools: the booking ledger).
        metrics_port: Serve the worker's Prometheus metrics at ``/metrics`` on this
            port; None (the default) collects and serves none.
        metrics_host: The address the metrics are served on: ``127.0.0.1`` (the
            default) for this host only, ``0.0.0.0`` for a scraper on another host
            or container.
        log_format: How a worker writes its log records: ``text`` (Celery's format,
            the default) or ``json`` (one object a line, with the call id, run id and
            tool of the call a record is about, :mod:`executor.tracing`).
        signing_key: Shared secret of message signing (:mod:`wire.signing`): clients
            sign every call with it and workers refuse calls it does not sign; None
            (the default) signs nothing and checks nothing.
        worker_pool: The pool ``celery -A executor worker`` runs when its command line
            names none (Celery's ``worker_pool`` setting): ``prefork``, ``threads``,
            ``solo`` or ``asyncio`` (toolexec's asyncio pool); None (the default)
            leaves Celery's default, prefork.
        task_events: When a worker sends Celery's task events (what Flower and ``celery
            events`` show): ``auto`` (the default) sends none until a monitor asks for
            them (Celery's ``enable_events`` control command, which Flower broadcasts
            every 5 seconds), ``on`` sends them from the start (Celery's ``-E``),
            ``off`` never (the worker refuses ``enable_events``, and ``-E`` too).
        sentinel_master: The name of the Redis group whose Sentinels a ``sentinel://``
            broker or Redis URL names (:mod:`wire.connect`); required with such a URL,
            refused without one.
        replica_acks: How many replicas of the Redis of ``redis_url`` must have a keyed
            call's begin before its tool starts, and its stored outcome before the worker
            moves on (Redis' ``WAIT``, bounded by the call's deadline): a failover then
            cannot forget that an idempotent call ran, and run it again. 0 (the default)
            waits for none.
        loop_reads: Whether a worker of the asyncio pool with a Redis broker reads its
            queues on the pool's event loop (:mod:`executor.pools.reads`) rather than in
            Celery's consumer: True (the default) or False.
        run_log: Whether this side writes each call's life into its agent run's event
            log in Redis (:mod:`wire.runlog`), which ``toolexec ui`` shows: True (the
            default) or False (``TOOLEXEC_RUN_LOG=off``).
        run_log_ttl: Seconds a run's event log is kept after its latest call was sent.
        run_log_max: The most events a run's log keeps (the newest; about, ``MAXLEN ~``).
        ui_token: The token ``toolexec ui`` asks every request for (a bearer token, or
            ``?token=`` once, kept in a cookie); required to serve it off loopback.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    broker_url: str = "redis://localhost:6379/0"
    redis_url: str = ""
    tool_modules: tuple[str, ...] = ("tasks",)
    default_timeout: float | None = Field(default=60.0, gt=0, le=MAX_TIMEOUT, allow_inf_nan=False)
    heartbeat_interval: float = Field(default=3.0, gt=0, allow_inf_nan=False)
    reply_ttl: int = Field(default=600, gt=0)
    outcome_ttl: int = Field(default=86_400, gt=0)
    handle_ttl: int = Field(default=86_400, gt=0)
    claim_margin: float = Field(default=30.0, ge=0, allow_inf_nan=False)
    visibility_timeout: int = Field(default=3600, gt=0)
    ack_emulation: bool = False
    max_argument_bytes: int = Field(default=1_048_576, gt=0)
    max_result_bytes: int = Field(default=4_194_304, gt=0)
    max_deliveries: int = Field(default=3, ge=1)
    data_dir: str = Field(default_factory=_default_data_dir)
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    metrics_host: str = Field(default="127.0.0.1", min_length=1)
    log_format: Literal["text", "json"] = "text"
    signing_key: SecretStr | None = None
    worker_pool: Literal["prefork", "threads", "solo", "asyncio"] | None = None
    task_events: Literal["auto", "on", "off"] = "auto"
    sentinel_master: str | None = Field(default=None, min_length=1)
    replica_acks: int = Field(default=0, ge=0, le=MAX_REPLICA_ACKS)
    loop_reads: bool = True
    run_log: bool = True
    run_log_ttl: int = Field(default=86_400, gt=0)
    run_log_max: int = Field(default=10_000, ge=100)
    ui_token: SecretStr | None = Field(default=None)

    @field_validator("broker_url")
    @classmethod
    def _broker_url_is_redis_or_rabbitmq(cls, value: str) -> str:
        if not value.startswith(BROKER_SCHEMES):
            raise ValueError(
                f"must be a Redis ({', '.join(REDIS_SCHEMES)}) or RabbitMQ "
                f"({', '.join(AMQP_SCHEMES)}) URL: toolexec's client publishes to no other broker"
            )
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_url_is_redis(cls, value: str) -> str:
        if value and not is_redis_url(value):
            raise ValueError("must be a redis://, rediss://, unix:// or sentinel:// URL")
        return value

    @field_validator("signing_key")
    @classmethod
    def _signing_key_is_long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_KEY_CHARS:
            raise ValueError(f"must be at least {MIN_KEY_CHARS} characters (make one: {MAKE_KEY})")
        return value

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        # A Redis URL's password stays out of reprs (tracebacks, logs); SecretStr hides the key.
        for name, value in super().__repr_args__():
            yield name, without_password(value) if name in ("broker_url", "redis_url") else value

    def model_post_init(self, context: Any, /) -> None:
        if not self.redis_url:
            if not is_redis_url(self.broker_url):
                raise ValueError(
                    "TOOLEXEC_REDIS_URL is required when TOOLEXEC_BROKER_URL is not Redis "
                    f"(broker is {self.broker_url.split('://')[0]}://...)"
                )
            object.__setattr__(self, "redis_url", self.broker_url)
        self._check_sentinels()

    def _check_sentinels(self) -> None:
        urls = {"TOOLEXEC_BROKER_URL": self.broker_url, "TOOLEXEC_REDIS_URL": self.redis_url}
        named = [name for name, url in urls.items() if is_sentinel_url(url)]
        if self.sentinel_master is not None and not named:
            raise ValueError(
                "TOOLEXEC_SENTINEL_MASTER is set, but neither TOOLEXEC_BROKER_URL nor "
                "TOOLEXEC_REDIS_URL is a sentinel:// URL: name the Sentinels there, or unset it"
            )
        for name in named:
            try:
                sentinel_group(urls[name], self.sentinel_master)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Build settings from ``TOOLEXEC_*`` environment variables.

        Args:
            environ: The mapping to read; ``os.environ`` when omitted.
            **overrides: Field values that win over the environment.

        Raises:
            ConfigurationError: A variable holds a value that does not parse; the
                message names the variable.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field, variable in ENVIRONMENT_VARIABLES.items():
            raw = env.get(variable)
            if raw is None or raw == "":
                continue
            if field == "tool_modules":
                values[field] = tuple(m.strip() for m in raw.split(",") if m.strip())
            elif field == "default_timeout" and raw.strip().lower() in ("none", "off"):
                values[field] = None
            else:
                values[field] = raw
        values.update(overrides)
        try:
            return cls(**values)
        except ValidationError as exc:
            problems = []
            for error in exc.errors():
                if not error["loc"]:
                    problems.append(str(error["msg"]).removeprefix("Value error, "))
                    continue
                field = str(error["loc"][0])
                name = ENVIRONMENT_VARIABLES.get(field, field)
                given = error.get("input")
                if field in ("broker_url", "redis_url") and isinstance(given, str):
                    given = without_password(given)
                shown = "a secret" if field in ("signing_key", "ui_token") else repr(given)
                problems.append(
                    f"{name}: {str(error['msg']).removeprefix('Value error, ')} (got {shown})"
                )
            raise ConfigurationError("invalid toolexec settings: " + "; ".join(problems)) from None


#: Field name -> environment variable.
ENVIRONMENT_VARIABLES: dict[str, str] = {
    "broker_url": "TOOLEXEC_BROKER_URL",
    "redis_url": "TOOLEXEC_REDIS_URL",
    "tool_modules": "TOOLEXEC_TOOL_MODULES",
    "default_timeout": "TOOLEXEC_DEFAULT_TIMEOUT",
    "heartbeat_interval": "TOOLEXEC_HEARTBEAT_INTERVAL",
    "reply_ttl": "TOOLEXEC_REPLY_TTL",
    "outcome_ttl": "TOOLEXEC_OUTCOME_TTL",
    "handle_ttl": "TOOLEXEC_HANDLE_TTL",
    "claim_margin": "TOOLEXEC_CLAIM_MARGIN",
    "visibility_timeout": "TOOLEXEC_VISIBILITY_TIMEOUT",
    "ack_emulation": "TOOLEXEC_ACK_EMULATION",
    "max_argument_bytes": "TOOLEXEC_MAX_ARGUMENT_BYTES",
    "max_result_bytes": "TOOLEXEC_MAX_RESULT_BYTES",
    "max_deliveries": "TOOLEXEC_MAX_DELIVERIES",
    "data_dir": "TOOLEXEC_DATA_DIR",
    "metrics_port": "TOOLEXEC_METRICS_PORT",
    "metrics_host": "TOOLEXEC_METRICS_HOST",
    "log_format": "TOOLEXEC_LOG_FORMAT",
    "signing_key": "TOOLEXEC_SIGNING_KEY",
    "worker_pool": "TOOLEXEC_WORKER_POOL",
    "task_events": "TOOLEXEC_TASK_EVENTS",
    "sentinel_master": "TOOLEXEC_SENTINEL_MASTER",
    "replica_acks": "TOOLEXEC_REPLICA_ACKS",
    "loop_reads": "TOOLEXEC_LOOP_READS",
    "run_log": "TOOLEXEC_RUN_LOG",
    "run_log_ttl": "TOOLEXEC_RUN_LOG_TTL",
    "run_log_max": "TOOLEXEC_RUN_LOG_MAX",
    "ui_token": "TOOLEXEC_UI_TOKEN",
}
