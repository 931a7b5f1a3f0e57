"""TOOLEXEC_TASK_EVENTS: when a worker sends Celery's task events (executor.seams.events)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from celery.worker import control

from executor.seams import events
from executor.seams.app import create_app
from executor.seams.events import TaskEvents, enable_events
from wire.errors import ConfigurationError
from wire.settings import Settings

BROKER = {"TOOLEXEC_BROKER_URL": "redis://127.0.0.1:1/0"}


def settings_with(value: str | None) -> Settings:
    env = BROKER if value is None else {**BROKER, "TOOLEXEC_TASK_EVENTS": value}
    return Settings.from_env(env, tool_modules=())


# -- the setting -------------------------------------------------------------------------


def test_the_default_is_auto() -> None:
    assert settings_with(None).task_events == "auto"
    assert settings_with("").task_events == "auto"


@pytest.mark.parametrize("value", ["auto", "on", "off"])
def test_each_of_the_three_values_parses(value: str) -> None:
    assert settings_with(value).task_events == value


@pytest.mark.parametrize("value", ["yes", "true", "ON", "1", "batched"])
def test_any_other_value_is_a_configuration_error_naming_the_variable_and_the_choices(
    value: str,
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        settings_with(value)

    message = str(refused.value)
    assert "TOOLEXEC_TASK_EVENTS" in message and "'auto', 'on' or 'off'" in message, message
    assert repr(value) in message, message


# -- the app: Celery's worker_send_task_events -----------------------------------------------


@pytest.mark.parametrize(
    ("value", "at_start"), [(None, False), ("auto", False), ("on", True), ("off", False)]
)
def test_the_app_sends_task_events_from_the_start_only_when_they_are_on(
    value: str | None, at_start: bool
) -> None:
    app = create_app(settings_with(value))

    assert app.conf.worker_send_task_events is at_start


def test_the_app_runs_the_task_events_bootstep() -> None:
    app = create_app(settings_with(None))

    assert TaskEvents in app.steps["worker"]


# -- the worker bootstep: off wins over -E -----------------------------------------------------


def worker(value: str | None, *, task_events: bool) -> Any:
    """What the bootstep sees of Celery's WorkController: its app and ``task_events``."""
    return SimpleNamespace(
        app=SimpleNamespace(toolexec_settings=settings_with(value)), task_events=task_events
    )


@pytest.mark.parametrize(
    ("value", "dash_e", "sends"),
    [
        ("auto", True, True),  # -E on the command line, as Celery always read it
        ("auto", False, False),
        ("on", True, True),
        ("off", True, False),  # the setting wins, with a warning
        ("off", False, False),
    ],
)
def test_the_bootstep_leaves_celerys_choice_except_that_off_wins_over_dash_e(
    value: str, dash_e: bool, sends: bool
) -> None:
    parent = worker(value, task_events=dash_e)

    TaskEvents(parent)

    assert parent.task_events is sends


def test_off_with_dash_e_warns_that_the_setting_wins(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger=events.__name__):
        TaskEvents(worker("off", task_events=True))

    assert "TOOLEXEC_TASK_EVENTS=off: this worker sends no task events" in caplog.text


def test_the_bootstep_leaves_a_worker_of_another_app_alone() -> None:
    parent = SimpleNamespace(app=SimpleNamespace(), task_events=True)

    TaskEvents(parent)

    assert parent.task_events is True


# -- the enable_events control command ----------------------------------------------------------


class Dispatcher:
    """Celery's event dispatcher as ``enable_events`` reads it: enabled, and its groups."""

    def __init__(self, *, enabled: bool = True, groups: set[str] | None = None) -> None:
        self.enabled = enabled
        self.groups = {"worker"} if groups is None else groups


def control_state(value: str | None, dispatcher: Dispatcher | None) -> Any:
    """The state Celery's pidbox hands a control command: the app and the consumer."""
    app = SimpleNamespace(toolexec_settings=settings_with(value))
    return SimpleNamespace(app=app, consumer=SimpleNamespace(event_dispatcher=dispatcher))


def test_enable_events_is_toolexecs_in_celerys_registry_of_control_commands() -> None:
    assert control.Panel.data["enable_events"] is enable_events


@pytest.mark.parametrize("value", [None, "auto", "on"])
def test_where_the_setting_allows_it_enable_events_adds_celerys_task_group(
    value: str | None,
) -> None:
    dispatcher = Dispatcher()

    assert enable_events(control_state(value, dispatcher)) == {"ok": "task events enabled"}
    assert dispatcher.groups == {"worker", "task"}


def test_with_task_events_off_enable_events_is_refused_naming_the_setting() -> None:
    dispatcher = Dispatcher()

    reply = enable_events(control_state("off", dispatcher))

    assert reply == {"error": "task events are off on this worker (TOOLEXEC_TASK_EVENTS=off)"}
    assert dispatcher.groups == {"worker"}


def test_a_worker_without_an_event_dispatcher_says_why_enable_events_cannot_work() -> None:
    reply = enable_events(control_state("auto", Dispatcher(enabled=False)))

    assert "error" in reply and "--without-heartbeat" in reply["error"], reply


def test_a_worker_of_another_app_gets_celerys_enable_events() -> None:
    state = SimpleNamespace(
        app=SimpleNamespace(), consumer=SimpleNamespace(event_dispatcher=Dispatcher())
    )

    assert enable_events(state) == {"ok": "task events enabled"}
