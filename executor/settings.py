"""Settings: the one place that reads the environment.

Both sides build a :class:`Settings` with :meth:`Settings.from_env` and hand it down;
no other module reads ``os.environ``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from executor.errors import ConfigurationError

__all__ = ["ENVIRONMENT_VARIABLES", "Settings"]


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
        claim_margin: Seconds added to a claim's TTL beyond the deadline and hard limit.
        visibility_timeout: Seconds before Redis redelivers an unacknowledged message;
            must exceed every tool's hard limit. Only used with ``ack_emulation``.
        ack_emulation: Keep kombu's copy of each taken message until it is acknowledged,
            restored after ``visibility_timeout`` if its worker vanished. Off by default:
            the client notices a lost worker within seconds and sends its call again.
        max_argument_bytes: Largest JSON encoding of a call's arguments accepted.
        max_result_bytes: Largest JSON encoding of a tool's result accepted.
        data_dir: Where tools keep files (the booking ledger, the search index).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    broker_url: str = "redis://localhost:6379/0"
    redis_url: str = ""
    tool_modules: tuple[str, ...] = ("tasks",)
    default_timeout: float | None = Field(default=60.0, gt=0, allow_inf_nan=False)
    heartbeat_interval: float = Field(default=3.0, gt=0, allow_inf_nan=False)
    reply_ttl: int = Field(default=600, gt=0)
    outcome_ttl: int = Field(default=86_400, gt=0)
    claim_margin: float = Field(default=30.0, ge=0, allow_inf_nan=False)
    visibility_timeout: int = Field(default=3600, gt=0)
    ack_emulation: bool = False
    max_argument_bytes: int = Field(default=1_048_576, gt=0)
    max_result_bytes: int = Field(default=4_194_304, gt=0)
    data_dir: str = Field(default_factory=_default_data_dir)

    @field_validator("redis_url")
    @classmethod
    def _redis_url_is_redis(cls, value: str) -> str:
        if value and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        return value

    def model_post_init(self, __context: Any) -> None:
        if not self.redis_url:
            if not self.broker_url.startswith(("redis://", "rediss://", "unix://")):
                raise ValueError(
                    "TOOLEXEC_REDIS_URL is required when TOOLEXEC_BROKER_URL is not Redis "
                    f"(broker is {self.broker_url.split('://')[0]}://...)"
                )
            object.__setattr__(self, "redis_url", self.broker_url)

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
                problems.append(f"{name}: {error['msg']} (got {error.get('input')!r})")
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
    "claim_margin": "TOOLEXEC_CLAIM_MARGIN",
    "visibility_timeout": "TOOLEXEC_VISIBILITY_TIMEOUT",
    "ack_emulation": "TOOLEXEC_ACK_EMULATION",
    "max_argument_bytes": "TOOLEXEC_MAX_ARGUMENT_BYTES",
    "max_result_bytes": "TOOLEXEC_MAX_RESULT_BYTES",
    "data_dir": "TOOLEXEC_DATA_DIR",
}
