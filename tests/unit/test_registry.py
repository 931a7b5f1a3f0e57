"""executor.registry: the @tool decorator fails loudly and keeps one tool per name."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from executor.errors import ToolDefinitionError
from executor.registry import get_tool, registered_tools, tool, unregister
from wire.errors import ToolexecError
from wire.models import MAX_TIMEOUT, ToolSpec


@pytest.fixture
def fresh_name() -> Iterator[Callable[[], str]]:
    """Unique tool names, unregistered after the test (never clear the whole registry)."""
    names: list[str] = []

    def make() -> str:
        names.append(f"t_{uuid.uuid4().hex[:12]}")
        return names[-1]

    yield make
    for name in names:
        unregister(name)


def add(a: int, b: int = 1) -> int:
    """Add two numbers."""
    return a + b


def other_add(a: int, b: int = 1) -> int:
    """Add two numbers, differently."""
    return b + a


def test_bare_tool_registers_the_function_under_its_own_name_and_returns_it_unchanged() -> None:
    def registry_test_bare_multiply(x: int, y: int) -> int:
        """Multiply two numbers."""
        return x * y

    try:
        decorated = tool(registry_test_bare_multiply)

        assert decorated is registry_test_bare_multiply
        assert decorated(x=3, y=4) == 12
        definition = get_tool("registry_test_bare_multiply")
        assert definition is not None and definition.func is registry_test_bare_multiply
        assert definition.name == "registry_test_bare_multiply"
    finally:
        unregister("registry_test_bare_multiply")


def test_parameterised_tool_registers_under_the_given_name_and_returns_the_function(
    fresh_name: Callable[[], str],
) -> None:
    name = fresh_name()

    decorated = tool(name=name)(add)

    assert decorated is add
    definition = get_tool(name)
    assert definition is not None
    assert (definition.func, definition.spec.name, definition.is_async) == (add, name, False)
    assert definition.spec.description == "Add two numbers."
    assert definition.model.model_validate({"a": "2"}).a == 2  # type: ignore[attr-defined]


def test_the_spec_carries_every_option(fresh_name: Callable[[], str]) -> None:
    name = fresh_name()

    tool(
        name=name,
        description="Sum.",
        idempotent=True,
        timeout=5,
        queue="math.slow",
        hard_timeout=2.5,
        delivery="at_most_once",
        cache_errors=True,
    )(add)

    spec = get_tool(name).spec  # type: ignore[union-attr]
    assert spec.description == "Sum."
    assert (spec.idempotent, spec.queue, spec.delivery, spec.cache_errors) == (
        True,
        "math.slow",
        "at_most_once",
        True,
    )
    assert spec.timeout == 5.0 and isinstance(spec.timeout, float)
    assert spec.hard_timeout == 2.5
    assert spec.parameters["required"] == ["a"]


def test_defaults_are_the_default_queue_no_timeouts_and_not_idempotent(
    fresh_name: Callable[[], str],
) -> None:
    name = fresh_name()
    tool(name=name)(add)

    spec = get_tool(name).spec  # type: ignore[union-attr]

    assert (spec.queue, spec.timeout, spec.hard_timeout, spec.idempotent, spec.cache_errors) == (
        "default",
        None,
        None,
        False,
        False,
    )


@pytest.mark.parametrize(
    ("idempotent", "expected"), [(False, "at_most_once"), (True, "at_least_once")]
)
def test_default_delivery_is_at_most_once_unless_the_tool_is_idempotent(
    fresh_name: Callable[[], str], idempotent: bool, expected: str
) -> None:
    name = fresh_name()
    tool(name=name, idempotent=idempotent)(add)

    assert get_tool(name).spec.delivery == expected  # type: ignore[union-attr]


def test_an_explicit_delivery_wins_over_the_default(fresh_name: Callable[[], str]) -> None:
    name = fresh_name()
    tool(name=name, delivery="at_least_once")(add)

    assert get_tool(name).spec.delivery == "at_least_once"  # type: ignore[union-attr]


def test_async_tools_are_marked_async(fresh_name: Callable[[], str]) -> None:
    async def fetch(url: str) -> str:
        """Fetch a page."""
        return url

    name = fresh_name()
    tool(name=name)(fetch)

    assert get_tool(name).is_async is True  # type: ignore[union-attr]


def test_a_second_function_under_a_taken_name_is_rejected_naming_the_first(
    fresh_name: Callable[[], str],
) -> None:
    name = fresh_name()
    tool(name=name)(add)

    with pytest.raises(ToolDefinitionError) as info:
        tool(name=name)(other_add)

    message = str(info.value)
    assert f"a tool named {name!r} is already registered" in message
    assert f"{__name__}.add" in message
    assert "@tool(name=...)" in message
    assert get_tool(name).func is add  # type: ignore[union-attr]


def test_a_taken_name_is_rejected_even_for_a_bare_tool() -> None:
    def registry_test_taken(x: int) -> int:
        """Echo."""
        return x

    def impostor(x: int) -> int:
        """Echo too."""
        return x

    try:
        tool(registry_test_taken)
        with pytest.raises(ToolDefinitionError, match="already registered"):
            tool(name="registry_test_taken")(impostor)
    finally:
        unregister("registry_test_taken")


def test_registering_the_same_function_again_is_allowed_like_a_reimport(
    fresh_name: Callable[[], str],
) -> None:
    name = fresh_name()
    tool(name=name)(add)

    assert tool(name=name)(add) is add
    assert get_tool(name).func is add  # type: ignore[union-attr]


def test_an_unknown_option_is_rejected_listing_the_known_options() -> None:
    with pytest.raises(ToolDefinitionError) as info:
        tool(timout=5)  # typo, rejected before any function is seen

    message = str(info.value)
    assert "unknown @tool option(s) 'timout'" in message
    for option in (
        "name",
        "description",
        "idempotent",
        "timeout",
        "queue",
        "hard_timeout",
        "delivery",
        "cache_errors",
    ):
        assert option in message.split("known options:")[1]


@pytest.mark.parametrize("option", ["timeout", "hard_timeout"])
@pytest.mark.parametrize("value", [0, -1, -0.5, float("nan"), float("inf"), True, "5"])
def test_a_timeout_that_is_not_a_positive_number_of_seconds_is_rejected(
    fresh_name: Callable[[], str], option: str, value: Any
) -> None:
    name = fresh_name()

    with pytest.raises(
        ToolDefinitionError,
        match=rf"tool '{name}': {option} must be a positive number of seconds or None",
    ):
        tool(name=name, **{option: value})(add)
    assert get_tool(name) is None


@pytest.mark.parametrize("option", ["timeout", "hard_timeout"])
@pytest.mark.parametrize("value", [MAX_TIMEOUT + 1, 1e12, 1e300])
def test_a_timeout_longer_than_the_wire_allows_is_rejected_naming_the_bound(
    fresh_name: Callable[[], str], option: str, value: float
) -> None:
    name = fresh_name()

    with pytest.raises(
        ToolDefinitionError, match=rf"tool '{name}': {option} must be at most 31622400 seconds"
    ):
        tool(name=name, **{option: value})(add)
    assert get_tool(name) is None
    tool(name=name, **{option: MAX_TIMEOUT})(add)  # the bound itself is allowed


def test_a_timeout_of_none_is_accepted(fresh_name: Callable[[], str]) -> None:
    name = fresh_name()
    tool(name=name, timeout=None, hard_timeout=None)(add)

    assert get_tool(name).spec.timeout is None  # type: ignore[union-attr]


def test_an_unknown_delivery_mode_is_rejected_naming_the_two_modes(
    fresh_name: Callable[[], str],
) -> None:
    with pytest.raises(
        ToolDefinitionError,
        match="delivery must be 'at_most_once' or 'at_least_once', got 'exactly_once'",
    ):
        tool(name=fresh_name(), delivery="exactly_once")(add)


@pytest.mark.parametrize("queue", ["", "has space", "-leading-dash", 5, "q" * 101])
def test_an_invalid_queue_name_is_rejected(fresh_name: Callable[[], str], queue: Any) -> None:
    with pytest.raises(ToolDefinitionError, match="invalid queue name"):
        tool(name=fresh_name(), queue=queue)(add)


@pytest.mark.parametrize("name", ["", "1st", "has space", "dotted.name", "x" * 65, 7])
def test_an_invalid_tool_name_is_rejected_saying_what_is_allowed(name: Any) -> None:
    with pytest.raises(
        ToolDefinitionError,
        match="invalid tool name .*use 1-64 letters, digits, '_' or '-', starting with a letter",
    ):
        tool(name=name)(add)


def test_a_lambda_needs_an_explicit_name() -> None:
    echo = lambda text: text
    echo.__doc__ = "Echo."

    with pytest.raises(ToolDefinitionError, match="invalid tool name '<lambda>'"):
        tool(echo)


def test_cache_errors_without_idempotent_is_rejected(fresh_name: Callable[[], str]) -> None:
    with pytest.raises(ToolDefinitionError, match="cache_errors=True needs idempotent=True"):
        tool(name=fresh_name(), cache_errors=True)(add)


def test_a_bad_signature_fails_registration_and_registers_nothing(
    fresh_name: Callable[[], str],
) -> None:
    def spread(*values: int) -> int:
        """Add numbers."""
        return sum(values)

    name = fresh_name()
    with pytest.raises(ToolDefinitionError, match=r"\*args"):
        tool(name=name)(spread)
    assert get_tool(name) is None


def test_calling_tool_with_a_string_instead_of_a_function_is_rejected() -> None:
    with pytest.raises(ToolDefinitionError, match="@tool expects a function, got str"):
        tool("search")  # type: ignore[call-overload]


def test_registered_tools_is_a_copy_of_the_registry(fresh_name: Callable[[], str]) -> None:
    name = fresh_name()
    tool(name=name)(add)

    snapshot = registered_tools()
    snapshot.pop(name)

    assert get_tool(name) is not None
    assert name in registered_tools()


def test_unregister_removes_a_tool_and_ignores_an_unknown_name(
    fresh_name: Callable[[], str],
) -> None:
    name = fresh_name()
    tool(name=name)(add)

    unregister(name)
    unregister(name)

    assert get_tool(name) is None


def test_an_unknown_name_has_no_tool() -> None:
    assert get_tool(f"missing_{uuid.uuid4().hex}") is None


def test_registration_errors_belong_to_the_worker_error_tree() -> None:
    assert issubclass(ToolDefinitionError, ToolexecError)


def test_requires_approval_travels_in_the_spec_and_defaults_to_false(
    fresh_name: Callable[[], str],
) -> None:
    gated, plain = fresh_name(), fresh_name()
    tool(name=gated, requires_approval=True)(add)
    tool(name=plain)(add)

    assert get_tool(gated).spec.requires_approval is True  # type: ignore[union-attr]
    assert get_tool(plain).spec.requires_approval is False  # type: ignore[union-attr]


@pytest.mark.parametrize("value", ["yes", 1, None, 0.0])
def test_requires_approval_that_is_not_true_or_false_is_rejected_naming_the_tool(
    fresh_name: Callable[[], str], value: Any
) -> None:
    name = fresh_name()

    with pytest.raises(
        ToolDefinitionError, match=f"tool '{name}': requires_approval must be True or False, got"
    ):
        tool(name=name, requires_approval=value)(add)

    assert get_tool(name) is None


def test_a_spec_published_before_requires_approval_existed_still_parses_as_not_requiring_it() -> (
    None
):
    older = ToolSpec.model_validate_json(
        '{"name": "x", "description": "d", "parameters": {"type": "object"}}'
    )

    assert older.requires_approval is False
