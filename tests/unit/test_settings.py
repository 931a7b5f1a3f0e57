"""wire.settings: one frozen Settings object, built from TOOLEXEC_* variables."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pydantic
import pytest

import executor
from wire.errors import ConfigurationError, ToolexecError
from wire.settings import ENVIRONMENT_VARIABLES, Settings


def test_defaults_without_any_variable() -> None:
    settings = Settings.from_env({})

    assert settings.broker_url == "redis://localhost:6379/0"
    assert settings.redis_url == "redis://localhost:6379/0"
    assert settings.tool_modules == ("tasks",)
    assert settings.default_timeout == 60.0
    assert (settings.heartbeat_interval, settings.reply_ttl, settings.outcome_ttl) == (
        3.0,
        600,
        86_400,
    )
    assert (settings.claim_margin, settings.visibility_timeout) == (30.0, 3600)
    assert (settings.max_argument_bytes, settings.max_result_bytes) == (1_048_576, 4_194_304)
    assert Path(settings.data_dir).name == ".toolexec"


@pytest.mark.parametrize(
    ("variable", "raw", "field", "expected"),
    [
        ("TOOLEXEC_BROKER_URL", "redis://broker:6380/2", "broker_url", "redis://broker:6380/2"),
        ("TOOLEXEC_REDIS_URL", "rediss://state:6390/1", "redis_url", "rediss://state:6390/1"),
        (
            "TOOLEXEC_TOOL_MODULES",
            " tasks , extra.tools,,more ",
            "tool_modules",
            ("tasks", "extra.tools", "more"),
        ),
        ("TOOLEXEC_DEFAULT_TIMEOUT", "2.5", "default_timeout", 2.5),
        ("TOOLEXEC_HEARTBEAT_INTERVAL", "0.5", "heartbeat_interval", 0.5),
        ("TOOLEXEC_REPLY_TTL", "30", "reply_ttl", 30),
        ("TOOLEXEC_OUTCOME_TTL", "3600", "outcome_ttl", 3600),
        ("TOOLEXEC_CLAIM_MARGIN", "0", "claim_margin", 0.0),
        ("TOOLEXEC_VISIBILITY_TIMEOUT", "7200", "visibility_timeout", 7200),
        ("TOOLEXEC_MAX_ARGUMENT_BYTES", "2048", "max_argument_bytes", 2048),
        ("TOOLEXEC_MAX_RESULT_BYTES", "4096", "max_result_bytes", 4096),
        ("TOOLEXEC_DATA_DIR", "/srv/toolexec", "data_dir", "/srv/toolexec"),
        ("TOOLEXEC_REPLICA_ACKS", "2", "replica_acks", 2),
    ],
)
def test_each_variable_is_parsed_into_its_field(
    variable: str, raw: str, field: str, expected: Any
) -> None:
    settings = Settings.from_env({variable: raw})

    assert getattr(settings, field) == expected
    assert type(getattr(settings, field)) is type(expected)


def test_every_field_has_exactly_one_variable() -> None:
    assert set(ENVIRONMENT_VARIABLES) == set(Settings.model_fields)
    assert len(set(ENVIRONMENT_VARIABLES.values())) == len(ENVIRONMENT_VARIABLES)
    assert all(v.startswith("TOOLEXEC_") for v in ENVIRONMENT_VARIABLES.values())


@pytest.mark.parametrize("raw", ["none", "None", "NONE", " off "])
def test_a_default_timeout_of_none_means_no_deadline(raw: str) -> None:
    assert Settings.from_env({"TOOLEXEC_DEFAULT_TIMEOUT": raw}).default_timeout is None


def test_an_empty_variable_means_the_default() -> None:
    assert Settings.from_env(
        {"TOOLEXEC_DEFAULT_TIMEOUT": "", "TOOLEXEC_TOOL_MODULES": ""}
    ) == Settings.from_env({})


def test_without_a_mapping_it_reads_the_process_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOOLEXEC_REPLY_TTL", "42")

    assert Settings.from_env().reply_ttl == 42


def test_overrides_win_over_the_environment() -> None:
    settings = Settings.from_env({"TOOLEXEC_DEFAULT_TIMEOUT": "5"}, default_timeout=None)

    assert settings.default_timeout is None


@pytest.mark.parametrize(
    ("variable", "raw"),
    [
        ("TOOLEXEC_DEFAULT_TIMEOUT", "soon"),
        ("TOOLEXEC_DEFAULT_TIMEOUT", "0"),
        ("TOOLEXEC_DEFAULT_TIMEOUT", "-1"),
        ("TOOLEXEC_DEFAULT_TIMEOUT", "nan"),
        ("TOOLEXEC_DEFAULT_TIMEOUT", "inf"),
        ("TOOLEXEC_HEARTBEAT_INTERVAL", "0"),
        ("TOOLEXEC_CLAIM_MARGIN", "-1"),
        ("TOOLEXEC_REPLY_TTL", "1.5"),
        ("TOOLEXEC_OUTCOME_TTL", "a day"),
        ("TOOLEXEC_VISIBILITY_TIMEOUT", "0"),
        ("TOOLEXEC_MAX_ARGUMENT_BYTES", "1MB"),
        ("TOOLEXEC_MAX_RESULT_BYTES", "-5"),
        ("TOOLEXEC_REDIS_URL", "http://cache:6379"),
        ("TOOLEXEC_REPLICA_ACKS", "-1"),
        ("TOOLEXEC_REPLICA_ACKS", "one"),
        ("TOOLEXEC_REPLICA_ACKS", "1.5"),
        ("TOOLEXEC_REPLICA_ACKS", "17"),
    ],
)
def test_a_value_that_does_not_parse_is_a_configuration_error_naming_the_variable(
    variable: str, raw: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env({variable: raw})

    message = str(info.value)
    assert message.startswith("invalid toolexec settings: ")
    assert f"{variable}: " in message
    assert repr(raw) in message


def test_every_bad_variable_is_reported_at_once() -> None:
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env({"TOOLEXEC_REPLY_TTL": "x", "TOOLEXEC_OUTCOME_TTL": "y"})

    assert "TOOLEXEC_REPLY_TTL" in str(info.value) and "TOOLEXEC_OUTCOME_TTL" in str(info.value)


def test_configuration_errors_are_value_errors_in_the_worker_error_tree() -> None:
    assert issubclass(ConfigurationError, ValueError)
    assert issubclass(ConfigurationError, ToolexecError)


def test_an_unknown_override_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="brokr_url"):
        Settings.from_env({}, brokr_url="redis://x")


def test_redis_url_defaults_to_the_broker_url() -> None:
    settings = Settings.from_env({"TOOLEXEC_BROKER_URL": "redis://broker:6379/3"})

    assert settings.redis_url == "redis://broker:6379/3"


def test_an_explicit_redis_url_is_kept_apart_from_the_broker() -> None:
    settings = Settings.from_env(
        {"TOOLEXEC_BROKER_URL": "redis://b/0", "TOOLEXEC_REDIS_URL": "redis://r/1"}
    )

    assert (settings.broker_url, settings.redis_url) == ("redis://b/0", "redis://r/1")


def test_a_non_redis_broker_needs_its_own_redis_url() -> None:
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env({"TOOLEXEC_BROKER_URL": "amqp://guest@rabbit//"})

    assert (
        "TOOLEXEC_REDIS_URL is required when TOOLEXEC_BROKER_URL is not Redis (broker is amqp://...)"
        in str(info.value)
    )
    assert "guest" not in str(info.value)  # credentials in the URL stay out of the message


def test_a_non_redis_broker_with_a_redis_url_is_accepted() -> None:
    settings = Settings.from_env(
        {"TOOLEXEC_BROKER_URL": "amqp://rabbit//", "TOOLEXEC_REDIS_URL": "redis://r/0"}
    )

    assert settings.redis_url == "redis://r/0"


def test_settings_are_frozen() -> None:
    settings = Settings.from_env({})

    with pytest.raises(pydantic.ValidationError, match="frozen"):
        settings.default_timeout = 1.0


def test_no_other_module_reads_the_environment() -> None:
    """Settings.from_env is the one place; the ops launchers only pass os.environ on to children."""
    allowed = {
        "wire/settings.py",
        "toolexec/worker_process.py",
        "toolexec/commands/demo.py",
        "toolexec/commands/worker.py",
    }
    root = Path(executor.__file__).parent.parent
    readers = []
    for package in ("wire", "executor", "agent_client", "tasks", "toolexec"):
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), relative)):
                if isinstance(node, ast.Attribute) and node.attr in (
                    "environ",
                    "getenv",
                    "environb",
                ):
                    readers.append(relative)
                if (
                    isinstance(node, ast.ImportFrom)
                    and node.module == "os"
                    and ({a.name for a in node.names} & {"environ", "getenv", "environb"})
                ):
                    readers.append(relative)
    assert sorted(set(readers) - allowed) == []


@pytest.mark.parametrize(
    "url", ["sqs://queue.example/", "http://user:secret@queue.example/", "kafka://k:9092"]
)
def test_a_broker_toolexec_cannot_publish_to_is_refused_naming_the_ones_it_can(url: str) -> None:
    for environ in (
        {"TOOLEXEC_BROKER_URL": url},
        {"TOOLEXEC_BROKER_URL": url, "TOOLEXEC_REDIS_URL": "redis://r/0"},
    ):
        with pytest.raises(ConfigurationError) as info:
            Settings.from_env(environ)

        message = str(info.value)
        assert message.startswith(
            "invalid toolexec settings: TOOLEXEC_BROKER_URL: must be a Redis (redis://"
        )
        assert (
            "RabbitMQ (amqp://, amqps://, pyamqp://)" in message
            and "REDIS_URL is required" not in message
        )
        assert "secret" not in message


@pytest.mark.parametrize(
    "url",
    [
        "redis://b/0",
        "rediss://b/0",
        "unix:///tmp/r.sock",
        "amqp://rabbit//",
        "amqps://rabbit//",
        "pyamqp://rabbit//",
        "memory://",
    ],
)
def test_every_broker_toolexec_carries_calls_over_is_accepted(url: str) -> None:
    assert (
        Settings.from_env(
            {"TOOLEXEC_BROKER_URL": url, "TOOLEXEC_REDIS_URL": "redis://r/0"}
        ).broker_url
        == url
    )
