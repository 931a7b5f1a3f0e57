"""The ``toolexec`` command's pure parts: arguments, ``--timeout``, exit codes, the
worker's argv."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from agent_client.deadline import NOT_SET
from agent_client.errors import (
    BrokerUnavailable,
    RemoteToolError,
    ToolArgumentsInvalid,
    ToolExecutionError,
    ToolNotFound,
    ToolOutcomeUnknown,
    ToolTimeoutError,
    WorkerLost,
)
from toolexec.commands.arguments import parse_arguments, parse_timeout
from toolexec.commands.call import exit_code_for
from toolexec.commands.exits import CommandFailed, ExitCode
from toolexec.commands.worker import worker_argv, worker_env
from wire.errors import ConfigurationError
from wire.settings import Settings


def parse(*words: str, stdin: str = "") -> dict[str, object]:
    return parse_arguments(words, stdin=io.StringIO(stdin))


def test_no_words_are_no_arguments() -> None:
    assert parse() == {}


def test_key_value_values_are_json_when_they_parse_and_text_otherwise() -> None:
    assert parse(
        "n=3", "ok=true", "none=null", "items=[1, 2]", "q=red fox", "zip=007", "x=", 'quoted="3"'
    ) == {
        "n": 3,
        "ok": True,
        "none": None,
        "items": [1, 2],
        "q": "red fox",
        "zip": "007",
        "x": "",
        "quoted": "3",
    }


def test_nan_and_infinity_are_text_not_numbers() -> None:
    assert parse("a=NaN", "b=Infinity") == {"a": "NaN", "b": "Infinity"}


def test_a_value_may_hold_an_equals_sign() -> None:
    assert parse("expr=a=b") == {"expr": "a=b"}


def test_key_value_words_apply_after_a_json_object_a_file_or_stdin(tmp_path: Path) -> None:
    source = tmp_path / "args.json"
    source.write_text(json.dumps({"a": 1, "b": 2}))

    assert parse('{"a": 1, "b": 2}', "b=3") == {"a": 1, "b": 3}
    assert parse(f"@{source}", "c=4") == {"a": 1, "b": 2, "c": 4}
    assert parse("-", "a=0", stdin='{"a": 1}') == {"a": 0}


@pytest.mark.parametrize(
    ("words", "says"),
    [
        (["word"], "is not a JSON object, key=value, @file or -"),
        (["=value"], "is not a JSON object, key=value, @file or -"),
        (["{broken"], "the arguments: not JSON"),
        (["[1]"], "must be a JSON object, not a JSON list"),
        (['{"a": NaN}'], "not JSON"),
        (["@/no/such/args.json"], "cannot read the arguments file"),
        (["{}", "{}"], "give the arguments as one JSON object, @file or -"),
        (["-"], "standard input: not JSON"),
    ],
)
def test_words_that_describe_no_object_are_bad_arguments(words: list[str], says: str) -> None:
    with pytest.raises(CommandFailed, match=says) as raised:
        parse(*words)

    assert raised.value.code is ExitCode.BAD_ARGUMENTS


def test_timeout_is_seconds_none_or_not_set() -> None:
    assert parse_timeout(None) is NOT_SET
    assert parse_timeout("none") is None
    assert parse_timeout("OFF") is None
    assert parse_timeout("2.5") == 2.5


@pytest.mark.parametrize("text", ["soon", "0", "-1", "nan", "inf", ""])
def test_any_other_timeout_is_a_bad_argument(text: str) -> None:
    with pytest.raises(CommandFailed, match="--timeout must be a positive number") as raised:
        parse_timeout(text)

    assert raised.value.code is ExitCode.BAD_ARGUMENTS


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ToolExecutionError("t", "ValueError", "boom"), 1),
        (ToolArgumentsInvalid("t", ["number: not an integer"]), 2),
        (ToolTimeoutError("t", 1.0), 3),
        (ToolExecutionError("t", "ToolHardTimeout", "ran past its hard limit"), 3),
        (ToolNotFound("t"), 4),
        (BrokerUnavailable("down", tool="t"), 5),
        (WorkerLost("gone", tool="t"), 6),
        (ToolOutcomeUnknown("t", 1.0), 7),
        (RemoteToolError("other", tool="t"), 1),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else str(value),
)
def test_each_error_of_a_call_has_its_exit_code(error: RemoteToolError, code: int) -> None:
    assert exit_code_for(error) == code


def test_the_default_worker_is_celerys_prefork_worker_with_task_events_left_to_the_setting() -> (
    None
):
    argv = worker_argv()

    assert argv[:6] == [sys.executable, "-m", "celery", "-A", "executor", "worker"]
    assert argv[argv.index("-P") + 1] == "prefork"
    assert not {"-c", "-Q", "-n", "-l"} & set(argv)  # Celery's own defaults
    # TOOLEXEC_TASK_EVENTS decides (the app's worker_send_task_events), not -E; and Celery's
    # worker heartbeat stays on, so its event dispatcher is there for a monitor's enable_events.
    assert "-E" not in argv and "--without-heartbeat" not in argv
    assert {"--without-gossip", "--without-mingle"} <= set(argv)


def test_worker_options_become_celerys() -> None:
    argv = worker_argv(
        pool="threads",
        concurrency=8,
        queues=["a", "b"],
        name="n@%h",
        loglevel="info",
        extra=["--max-tasks-per-child", "5"],
    )

    assert argv[argv.index("-P") + 1] == "threads"
    assert argv[argv.index("-c") + 1] == "8"
    assert argv[argv.index("-Q") + 1] == "a,b"
    assert argv[argv.index("-n") + 1] == "n@%h"
    assert argv[argv.index("-l") + 1] == "INFO"
    assert argv[-2:] == ["--max-tasks-per-child", "5"]


def test_the_asyncio_pool_is_celerys_custom_pool_named_in_the_environment() -> None:
    argv = worker_argv(pool="asyncio")
    env = worker_env({}, pool="asyncio", metrics_port=None)

    assert argv[argv.index("-P") + 1] == "custom"
    assert env["CELERY_CUSTOM_WORKER_POOL"] == "executor.pools.asyncio_pool:AsyncioPool"


def test_metrics_port_is_the_settings_variable_in_the_workers_environment() -> None:
    env = worker_env({"KEEP": "1"}, pool="prefork", metrics_port=9100)

    assert env == {"KEEP": "1", "TOOLEXEC_METRICS_PORT": "9100"}


def test_a_worker_environment_whose_settings_do_not_parse_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="TOOLEXEC_HEARTBEAT_INTERVAL"):
        worker_env({"TOOLEXEC_HEARTBEAT_INTERVAL": "often"}, pool="prefork", metrics_port=None)


def test_metrics_host_and_log_format_are_settings_variables_in_the_workers_environment() -> None:
    env = worker_env(
        {}, pool="prefork", metrics_port=9100, metrics_host="0.0.0.0", log_format="json"
    )

    assert env["TOOLEXEC_METRICS_HOST"] == "0.0.0.0"
    assert env["TOOLEXEC_LOG_FORMAT"] == "json"
    assert "TOOLEXEC_METRICS_HOST" not in worker_env({}, pool="prefork", metrics_port=9100)
    settings = Settings.from_env(env)
    assert (settings.metrics_host, settings.log_format) == ("0.0.0.0", "json")
    assert Settings.from_env({}).metrics_host == "127.0.0.1"


def test_a_log_format_other_than_text_or_json_is_refused_naming_the_variable() -> None:
    with pytest.raises(ConfigurationError, match="TOOLEXEC_LOG_FORMAT"):
        worker_env({}, pool="prefork", metrics_port=None, log_format="xml")
