"""agent_client.deadline and RemoteTool.effective_timeout: which timeout a call gets."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, cast

import pytest

from agent_client.client import ToolClient
from agent_client.deadline import NOT_SET, Timeout, check_timeout, resolve_timeout, time_left
from agent_client.errors import ToolTimeoutError
from agent_client.frameworks.lazybridge import lazybridge_limit
from agent_client.remote import RemoteTool
from wire.models import MAX_TIMEOUT, ToolSpec
from wire.settings import Settings

INVALID = [0, -1, -0.5, float("nan"), float("inf"), True, False, "5", [5]]


@dataclass
class FakeClient:
    """Just enough of a ToolClient for precedence: its settings (it cannot send a call)."""

    settings: Settings


def proxy(
    *,
    tool_timeout: float | None = None,
    settings_timeout: float | None = 60.0,
    timeout: Timeout = NOT_SET,
    default_timeout: Timeout = NOT_SET,
) -> RemoteTool:
    spec = ToolSpec(
        name="search", description="Search.", parameters={"type": "object"}, timeout=tool_timeout
    )
    client = cast(ToolClient, FakeClient(Settings(default_timeout=settings_timeout)))
    return RemoteTool(spec, timeout=timeout, default_timeout=default_timeout, client=client)


# -- resolve_timeout ------------------------------------------------------------------------


def test_the_first_level_that_is_set_wins() -> None:
    assert resolve_timeout(NOT_SET, 5, 10, 60) == 5.0
    assert resolve_timeout(3, 5, 10, 60) == 3.0


def test_none_means_no_deadline_and_wins_at_its_level() -> None:
    assert resolve_timeout(NOT_SET, None, 10, 60) is None
    assert resolve_timeout(2, None) == 2.0


def test_not_set_defers_to_the_next_level_down_to_no_deadline() -> None:
    assert resolve_timeout(NOT_SET, NOT_SET, NOT_SET, 60) == 60.0
    assert resolve_timeout(NOT_SET, NOT_SET) is None
    assert resolve_timeout() is None


def test_whole_seconds_come_back_as_floats() -> None:
    assert type(resolve_timeout(NOT_SET, 5)) is float


# -- check_timeout --------------------------------------------------------------------------


@pytest.mark.parametrize("value", INVALID, ids=repr)
def test_a_timeout_that_is_not_a_positive_finite_number_is_refused(value: Any) -> None:
    with pytest.raises(
        ValueError,
        match=r"timeout must be a positive number of seconds, None \(no deadline\) or NOT_SET; got",
    ):
        check_timeout(value)


@pytest.mark.parametrize("value", [MAX_TIMEOUT * 1.5, 1e12, 1e300])
def test_a_timeout_longer_than_the_wire_allows_is_refused_naming_the_bound(value: float) -> None:
    with pytest.raises(
        ValueError, match=r"timeout must be at most 31622400 seconds \(366 days\), or None"
    ):
        check_timeout(value)
    assert check_timeout(MAX_TIMEOUT) == MAX_TIMEOUT


def test_the_refusal_names_what_was_checked() -> None:
    with pytest.raises(ValueError, match="default_timeout must be"):
        check_timeout(0, what="default_timeout")


@pytest.mark.parametrize(
    ("value", "expected"), [(NOT_SET, NOT_SET), (None, None), (5, 5.0), (0.25, 0.25)]
)
def test_valid_timeouts_pass_through_and_numbers_become_floats(
    value: Timeout, expected: Timeout
) -> None:
    assert check_timeout(value) == expected


def test_not_set_is_not_none_and_reads_as_itself() -> None:
    assert NOT_SET is not None
    assert repr(NOT_SET) == "NOT_SET"


# -- RemoteTool: call > proxy > framework > toolset > tool's own > settings ------------------


def test_the_settings_default_applies_when_nothing_else_is_set() -> None:
    assert proxy(settings_timeout=60).effective_timeout() == 60.0


def test_a_settings_default_of_none_means_no_deadline() -> None:
    assert proxy(settings_timeout=None).effective_timeout() is None


def test_the_tools_own_timeout_beats_the_settings_default() -> None:
    assert proxy(tool_timeout=7, settings_timeout=60).effective_timeout() == 7.0


def test_the_toolsets_default_beats_the_tools_own_timeout() -> None:
    assert proxy(tool_timeout=7, default_timeout=20).effective_timeout() == 20.0


def test_the_framework_default_beats_the_toolsets_default_longer_or_shorter() -> None:
    assert proxy(tool_timeout=7, default_timeout=20).effective_timeout(framework=30) == 30.0
    assert proxy(tool_timeout=7, default_timeout=20).effective_timeout(framework=4) == 4.0


def test_an_explicit_proxy_timeout_beats_the_framework() -> None:
    remote = proxy(tool_timeout=7, timeout=3, default_timeout=20)

    assert remote.effective_timeout() == 3.0
    assert remote.effective_timeout(framework=30) == 3.0


def test_a_per_call_timeout_beats_every_other_level() -> None:
    remote = proxy(tool_timeout=7, timeout=3, default_timeout=20)

    assert remote.effective_timeout(call=1.5, framework=30) == 1.5


def test_an_explicit_none_means_no_deadline_even_when_lower_levels_set_one() -> None:
    assert proxy(tool_timeout=7, timeout=None, default_timeout=20).effective_timeout() is None
    assert proxy(tool_timeout=7, timeout=3).effective_timeout(call=None) is None


def test_a_toolset_or_framework_none_means_no_deadline_over_the_tools_own_timeout() -> None:
    assert proxy(tool_timeout=7, default_timeout=None).effective_timeout() is None
    assert proxy(tool_timeout=7).effective_timeout(framework=None) is None


def test_a_tool_without_its_own_timeout_defers_to_the_settings() -> None:
    # @tool(timeout=None) is "not set" for the tool: it cannot opt out of the settings default.
    assert proxy(tool_timeout=None, settings_timeout=45).effective_timeout() == 45.0


def test_the_timeout_property_is_the_resolved_default() -> None:
    remote = proxy(tool_timeout=7, default_timeout=20)

    assert remote.timeout == remote.effective_timeout() == 20.0


@pytest.mark.parametrize("value", INVALID, ids=repr)
@pytest.mark.parametrize("argument", ["timeout", "default_timeout"])
def test_a_proxy_refuses_an_invalid_timeout_when_built(argument: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"{argument} must be a positive number of seconds"):
        proxy(**{argument: value})


@pytest.mark.parametrize("value", INVALID, ids=repr)
def test_a_proxy_refuses_an_invalid_per_call_timeout(value: Any) -> None:
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        proxy().effective_timeout(call=value)


def test_the_limit_lazybridge_enforces_is_only_the_proxys_own() -> None:
    # A toolset default ranks below Agent(tool_timeout=), so LazyBridge is not told it.
    assert lazybridge_limit(proxy(tool_timeout=7)) is None
    assert lazybridge_limit(proxy(default_timeout=20)) is None
    assert lazybridge_limit(proxy(timeout=3, default_timeout=20)) == 3.0


def test_a_proxy_set_to_no_deadline_tells_lazybridge_a_limit_that_outranks_the_agents() -> None:
    limit = lazybridge_limit(proxy(timeout=None, default_timeout=20))
    assert limit is not None and limit >= 365 * 24 * 3600
    assert proxy(timeout=None, default_timeout=20).effective_timeout() is None


@pytest.mark.parametrize("value", [0, -1, True, "5", float("nan")])
def test_a_framework_timeout_is_checked_like_any_other(value: Any) -> None:
    with pytest.raises(ValueError, match="framework timeout must be a positive number"):
        proxy().effective_timeout(framework=value)


# -- a deadline counts from when the call was made --------------------------------------------


def test_time_left_counts_from_when_the_call_was_made() -> None:
    a_second_ago = time.monotonic() - 1.0
    left = time_left(3.0, a_second_ago)

    assert left is not None and 1.5 < left <= 2.0
    assert time_left(3.0, None) == 3.0  # not said: from now
    assert time_left(None, a_second_ago) is None  # no deadline
    assert (time_left(0.5, a_second_ago) or 0) < 0  # passed


@pytest.mark.parametrize("style", ["invoke", "invoke_sync"])
@pytest.mark.parametrize(("given", "deadline"), [({"timeout": 1.5}, 1.5), ({}, 7.0)])
def test_a_call_whose_deadline_passed_before_it_was_made_times_out_at_once_and_sends_nothing(
    style: str, given: dict[str, Any], deadline: float
) -> None:
    remote = proxy(
        tool_timeout=7
    )  # its client has no way to send: a send would raise AttributeError
    long_ago = time.monotonic() - 10.0

    with pytest.raises(ToolTimeoutError) as raised:
        if style == "invoke":
            asyncio.run(remote.invoke({}, started=long_ago, **given))
        else:
            remote.invoke_sync({}, started=long_ago, **given)

    assert raised.value.timeout == deadline  # the whole deadline, not what was left of it
    assert str(raised.value) == f"tool 'search' timed out after {deadline:g}s"
