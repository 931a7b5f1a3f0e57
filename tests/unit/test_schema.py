"""executor.schema.function_schema: JSON Schema from a signature and its docstring."""

from __future__ import annotations

import dataclasses
import enum
import socket
import threading
from collections.abc import Callable
from typing import Annotated, Any, Literal, Optional

import pydantic
import pytest
from pydantic import BaseModel, Field

from executor.errors import ToolDefinitionError
from executor.schema import FunctionSchema, function_schema


class Cabin(enum.Enum):
    ECONOMY = "economy"
    BUSINESS = "business"


class Address(BaseModel):
    city: str
    postcode: str = ""


@dataclasses.dataclass
class Window:
    start: int
    end: int


def search(
    query: str,
    limit: Annotated[int, Field(description="How many hits to return.", ge=1, le=50)] = 10,
    mode: Literal["exact", "fuzzy"] = "fuzzy",
    cabin: Cabin = Cabin.ECONOMY,
    address: Address | None = None,
    window: Window | None = None,
    tags: Optional[list[str]] = None,  # noqa: UP045 - Optional is what people write
) -> list[str]:
    """Search the corpus for passages.

    Returns the best passages first.

    Args:
        query: The words to look for,
            continued on a second line
            and a third.
        mode: How to match the words.
        cabin: Which cabin class.
        tags: Only passages with these tags.

    Returns:
        The passages.

    Raises:
        ValueError: never, in this test.
    """
    return []


def properties(schema: FunctionSchema) -> dict[str, Any]:
    found: dict[str, Any] = schema.parameters["properties"]
    return found


def test_the_description_is_the_docstring_text_before_its_sections() -> None:
    schema = function_schema(search, name="search")

    assert (
        schema.description == "Search the corpus for passages.\n\nReturns the best passages first."
    )


def test_an_explicit_description_replaces_the_docstring_summary_but_keeps_the_args() -> None:
    schema = function_schema(search, name="search", description="Find text.")

    assert schema.description == "Find text."
    assert properties(schema)["mode"]["description"] == "How to match the words."


def test_parameter_descriptions_come_from_the_args_section_with_continuation_lines_joined() -> None:
    described = {
        name: p.get("description")
        for name, p in properties(function_schema(search, name="s")).items()
    }

    assert described["query"] == "The words to look for, continued on a second line and a third."
    assert described["mode"] == "How to match the words."
    assert described["tags"] == "Only passages with these tags."


def test_sections_after_args_do_not_leak_into_parameter_descriptions() -> None:
    described = properties(function_schema(search, name="s"))["tags"]["description"]

    assert described == "Only passages with these tags."


def numpy_style(query: str, limit: int = 10) -> list[str]:
    """Search the corpus for passages.

    Returns the best passages first.

    Parameters
    ----------
    query : str
        The words to look for,
        continued on a second line.
    limit : int
        How many passages at most.

    Returns
    -------
    list of str
        The passages.
    """
    return []


def sphinx_style(query: str, limit: int = 10) -> list[str]:
    """Search the corpus for passages.

    Returns the best passages first.

    :param query: The words to look for,
        continued on a second line.
    :param int limit: How many passages at most.
    :returns: The passages.
    """
    return []


@pytest.mark.parametrize("func", [numpy_style, sphinx_style], ids=["numpy", "sphinx"])
def test_numpy_and_sphinx_docstrings_describe_the_tool_and_its_parameters(
    func: Callable[..., Any],
) -> None:
    schema = function_schema(func, name="s")

    assert (
        schema.description == "Search the corpus for passages.\n\nReturns the best passages first."
    )
    assert properties(schema)["query"]["description"] == (
        "The words to look for, continued on a second line."
    )
    assert properties(schema)["limit"]["description"] == "How many passages at most."


def test_an_attributes_section_describes_no_parameter() -> None:
    def tool_with_attributes(x: int) -> int:
        """Double x.

        Attributes:
            x: Not a parameter's description: the section names attributes.
        """
        return 2 * x

    assert "description" not in properties(function_schema(tool_with_attributes, name="t"))["x"]


def test_parameters_without_a_default_are_required_and_defaults_are_published() -> None:
    schema = function_schema(search, name="s")

    assert schema.parameters["required"] == ["query"]
    assert properties(schema)["limit"]["default"] == 10
    assert properties(schema)["mode"]["default"] == "fuzzy"
    assert properties(schema)["cabin"]["default"] == "economy"


def test_the_arguments_object_forbids_unknown_fields_and_carries_no_title() -> None:
    schema = function_schema(search, name="s")

    assert schema.parameters["type"] == "object"
    assert schema.parameters["additionalProperties"] is False
    assert "title" not in schema.parameters


def test_an_optional_parameter_accepts_null_and_defaults_to_none() -> None:
    schema = function_schema(search, name="s")
    tags = properties(schema)["tags"]

    assert {"type": "null"} in tags["anyOf"]
    assert {"type": "array", "items": {"type": "string"}} in tags["anyOf"]
    assert tags["default"] is None
    assert schema.model.model_validate({"query": "q", "tags": None}).tags is None  # type: ignore[attr-defined]


def test_a_literal_parameter_becomes_an_enum_of_its_values() -> None:
    mode = properties(function_schema(search, name="s"))["mode"]

    assert mode["enum"] == ["exact", "fuzzy"]
    assert mode["type"] == "string"


def test_an_enum_parameter_is_published_by_value_and_arrives_as_the_enum() -> None:
    schema = function_schema(search, name="s")

    assert schema.parameters["$defs"]["Cabin"]["enum"] == ["economy", "business"]
    validated = schema.model.model_validate({"query": "q", "cabin": "business"})
    assert validated.cabin is Cabin.BUSINESS  # type: ignore[attr-defined]


def test_a_nested_pydantic_model_is_an_object_schema_and_arrives_as_the_model() -> None:
    schema = function_schema(search, name="s")

    assert schema.parameters["$defs"]["Address"]["required"] == ["city"]
    assert {"$ref": "#/$defs/Address"} in properties(schema)["address"]["anyOf"]
    validated = schema.model.model_validate({"query": "q", "address": {"city": "Leeds"}})
    assert validated.address == Address(city="Leeds")  # type: ignore[attr-defined]


def test_a_dataclass_parameter_is_an_object_schema_and_arrives_as_the_dataclass() -> None:
    schema = function_schema(search, name="s")

    assert schema.parameters["$defs"]["Window"]["properties"] == {
        "start": {"title": "Start", "type": "integer"},
        "end": {"title": "End", "type": "integer"},
    }
    validated = schema.model.model_validate({"query": "q", "window": {"start": 1, "end": 2}})
    assert validated.window == Window(start=1, end=2)  # type: ignore[attr-defined]


def test_an_annotated_field_gives_its_description_and_bounds() -> None:
    limit = properties(function_schema(search, name="s"))["limit"]

    assert limit["description"] == "How many hits to return."
    assert (limit["minimum"], limit["maximum"], limit["type"]) == (1, 50, "integer")


def test_an_annotated_description_is_kept_when_the_docstring_does_not_describe_the_parameter() -> (
    None
):
    # `limit` is absent from search's Args section: the docstring must not erase it.
    assert "limit" not in search.__doc__.split("Args:")[1]  # type: ignore[union-attr]

    assert (
        properties(function_schema(search, name="s"))["limit"]["description"]
        == "How many hits to return."
    )


def test_the_argument_model_coerces_like_the_worker_will() -> None:
    model = function_schema(search, name="s").model

    assert model.model_validate({"query": "q", "limit": "5"}).limit == 5  # type: ignore[attr-defined]
    with pytest.raises(pydantic.ValidationError):
        model.model_validate({"query": "q", "limit": 0})
    with pytest.raises(pydantic.ValidationError):
        model.model_validate({"query": "q", "colour": "red"})


def test_the_argument_model_is_named_after_the_tool() -> None:
    assert (
        function_schema(search, name="full-text_search").model.__name__ == "FullTextSearchArguments"
    )


def test_async_def_is_detected() -> None:
    async def fetch(url: str) -> str:
        """Fetch a page."""
        return url

    assert function_schema(fetch, name="fetch").is_async is True
    assert function_schema(search, name="search").is_async is False


def test_a_parameter_named_like_a_pydantic_attribute_works_without_a_warning() -> None:
    def migrate(schema: str, json: bool = False, copy: int = 1) -> None:
        """Migrate a database schema."""

    # filterwarnings=error turns pydantic's "shadows an attribute" warning into a failure.
    model = function_schema(migrate, name="migrate").model

    validated = model.model_validate({"schema": "public", "json": True})
    assert (getattr(validated, "schema"), getattr(validated, "json")) == ("public", True)  # noqa: B009


def test_a_docstring_without_an_args_section_leaves_parameters_undescribed() -> None:
    def ping(host: str) -> str:
        """Ping a host."""
        return host

    schema = function_schema(ping, name="ping")

    assert schema.description == "Ping a host."
    assert "description" not in properties(schema)["host"]


# -- signatures that cannot be tools ---------------------------------------------------


def test_star_args_are_rejected_with_advice_to_name_each_argument() -> None:
    def spread(*values: int) -> int:
        """Add numbers."""
        return sum(values)

    with pytest.raises(
        ToolDefinitionError, match=r"tool 'spread', parameter 'values': \*args and \*\*kwargs"
    ) as info:
        function_schema(spread, name="spread")
    assert "declare each argument by name" in str(info.value)


def test_star_star_kwargs_are_rejected() -> None:
    def options(name: str, **extra: str) -> str:
        """Set options."""
        return name

    with pytest.raises(ToolDefinitionError, match=r"parameter 'extra': \*args and \*\*kwargs"):
        function_schema(options, name="options")


def test_positional_only_parameters_are_rejected_because_tools_are_called_by_keyword() -> None:
    def square(x: int, /) -> int:
        """Square a number."""
        return x * x

    with pytest.raises(
        ToolDefinitionError, match=r"parameter 'x': is positional-only; tools are called by keyword"
    ):
        function_schema(square, name="square")


def test_a_parameter_without_a_type_hint_is_rejected_with_an_example_hint() -> None:
    def greet(name, greeting: str = "hi") -> str:  # type: ignore[no-untyped-def]
        """Greet someone."""
        return f"{greeting} {name}"

    with pytest.raises(
        ToolDefinitionError, match=r"parameter 'name': needs a type hint, e.g. `name: str`"
    ):
        function_schema(greet, name="greet")


def test_a_socket_parameter_is_rejected_naming_the_parameter_and_the_json_types() -> None:
    def send(conn: socket.socket, data: str) -> None:
        """Send data."""

    with pytest.raises(ToolDefinitionError) as info:
        function_schema(send, name="send")
    message = str(info.value)
    assert message.startswith("tool 'send', parameter 'conn': socket is not a JSON type")
    assert (
        "use str, int, float, bool, list, dict, Literal, Enum, dataclasses or pydantic models"
        in message
    )
    assert "arbitrary_types_allowed" not in message  # pydantic's advice is wrong for a tool


def test_a_lock_parameter_is_rejected_as_not_a_json_type() -> None:
    def guarded(lock: threading.Lock, name: str) -> None:
        """Do something under a lock."""

    with pytest.raises(ToolDefinitionError, match=r"parameter 'lock': .* is not a JSON type"):
        function_schema(guarded, name="guarded")


def test_a_parameter_name_pydantic_reserves_is_rejected_with_advice_to_rename() -> None:
    def tune(model_config: str) -> None:
        """Tune a model."""

    with pytest.raises(
        ToolDefinitionError,
        match=r"parameter 'model_config': cannot be a tool argument .*rename it",
    ):
        function_schema(tune, name="tune")


def test_a_private_parameter_name_is_rejected() -> None:
    def hidden(_secret: str) -> None:
        """Hide it."""

    with pytest.raises(ToolDefinitionError, match=r"parameter '_secret': names starting with '_'"):
        function_schema(hidden, name="hidden")


def test_a_type_hint_that_does_not_resolve_is_rejected() -> None:
    def later(x: NoSuchType) -> None:  # type: ignore[name-defined]  # noqa: F821
        """Use a missing type."""

    with pytest.raises(
        ToolDefinitionError, match=r"tool 'later': cannot read its signature or type hints"
    ):
        function_schema(later, name="later")


def test_a_function_without_docstring_or_description_is_rejected_because_the_model_reads_it() -> (
    None
):
    def undocumented(x: int) -> int:
        return x

    with pytest.raises(ToolDefinitionError) as info:
        function_schema(undocumented, name="undocumented")
    assert "tool 'undocumented' has no description" in str(info.value)
    assert "@tool(description=...)" in str(info.value)


def test_a_docstring_with_only_sections_counts_as_no_description() -> None:
    def only_args(x: int) -> int:
        """
        Args:
            x: A number.
        """
        return x

    with pytest.raises(ToolDefinitionError, match="has no description"):
        function_schema(only_args, name="only_args")


def test_an_explicit_description_stands_in_for_a_missing_docstring() -> None:
    def undocumented(x: int) -> int:
        return x

    assert function_schema(undocumented, name="u", description="Echo x.").description == "Echo x."


def test_tool_definition_errors_are_type_errors() -> None:
    assert issubclass(ToolDefinitionError, TypeError)
