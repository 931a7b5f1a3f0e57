"""JSON Schema from a function's signature, type hints and docstring.

:func:`function_schema` is a numbered pipeline:

1. docstring → a description and one description per parameter (Google's ``Args:``,
   NumPy's ``Parameters`` or Sphinx's ``:param:``, read by ``docstring_parser``);
2. signature and type hints → one pydantic field per parameter;
3. ``pydantic.create_model`` → the argument model that validates and coerces calls;
4. the model → the JSON Schema the model and the client see;
5. a small frozen :class:`FunctionSchema`.

Anything it cannot express raises :class:`~executor.errors.ToolDefinitionError` at
import time, with a message that says what to change.
"""

from __future__ import annotations

import inspect
import re
import typing
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import docstring_parser
import pydantic
from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo

from executor.errors import ToolDefinitionError

__all__ = ["FunctionSchema", "function_schema"]

#: What docstring_parser names a parameter's entry (not an ``Attributes`` one).
_PARAMETER_SECTIONS = frozenset({"param", "parameter", "arg", "argument", "key", "keyword"})


@dataclass(frozen=True, kw_only=True)
class FunctionSchema:
    """What the schema builder learned about one tool function.

    Attributes:
        description: The tool's description (the docstring's text before its sections).
        parameters: JSON Schema of the arguments object.
        model: The pydantic model that validates and coerces arguments.
        is_async: True for ``async def`` tools.
    """

    description: str
    parameters: dict[str, Any]
    model: type[BaseModel]
    is_async: bool


def function_schema(
    func: Callable[..., Any], *, name: str, description: str | None = None
) -> FunctionSchema:
    """Build the schema of ``func``, registered as tool ``name``.

    Raises:
        ToolDefinitionError: The signature cannot be expressed as JSON Schema.
    """
    # 1. Docstring.
    doc_description, param_docs = _parse_docstring(inspect.getdoc(func) or "")
    description = description if description is not None else doc_description
    if not description:
        raise ToolDefinitionError(
            f"tool {name!r} has no description: give the function a docstring or pass "
            "@tool(description=...); the model reads it to decide when to call the tool"
        )
    # 2. Signature and type hints.
    fields = _fields(func, name=name, param_docs=param_docs)
    # 3. The argument model.
    model = _create_model(f"{_camel(name)}Arguments", fields, config=ConfigDict(extra="forbid"))
    # 4. JSON Schema.
    try:
        parameters = model.model_json_schema()
    except (pydantic.PydanticInvalidForJsonSchema, pydantic.PydanticSchemaGenerationError) as exc:
        raise ToolDefinitionError(
            f"tool {name!r}: its parameters cannot be expressed as JSON Schema ({exc}); "
            "use JSON types, Literal, Enum, dataclasses or pydantic models"
        ) from None
    parameters.pop("title", None)
    # 5. The result.
    return FunctionSchema(
        description=description,
        parameters=parameters,
        model=model,
        is_async=inspect.iscoroutinefunction(func),
    )


def _fields(
    func: Callable[..., Any], *, name: str, param_docs: dict[str, str]
) -> dict[str, tuple[Any, FieldInfo]]:
    try:
        signature = inspect.signature(func)
        hints = typing.get_type_hints(func, include_extras=True)
    except (NameError, TypeError, ValueError) as exc:
        raise ToolDefinitionError(
            f"tool {name!r}: cannot read its signature or type hints: {exc}"
        ) from None
    fields: dict[str, tuple[Any, FieldInfo]] = {}
    for param in signature.parameters.values():
        where = f"tool {name!r}, parameter {param.name!r}"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDefinitionError(
                f"{where}: *args and **kwargs cannot be described to a model; "
                "declare each argument by name"
            )
        if param.kind is param.POSITIONAL_ONLY:
            raise ToolDefinitionError(f"{where}: is positional-only; tools are called by keyword")
        if param.name.startswith("_"):
            raise ToolDefinitionError(
                f"{where}: names starting with '_' are not valid tool arguments"
            )
        if param.name not in hints:
            raise ToolDefinitionError(f"{where}: needs a type hint, e.g. `{param.name}: str`")
        annotation = hints[param.name]
        default = ... if param.default is param.empty else param.default
        described = param.name in param_docs
        # Only set a description the docstring gives: Field(description=None) would
        # erase one from Annotated[..., Field(description=...)].
        field = (
            Field(default=default, description=param_docs[param.name])
            if described
            else Field(default=default)
        )
        fields[param.name] = (annotation, field)
        try:
            # Fail here, at import, if pydantic cannot build a validator for this type.
            _create_model("_Probe", {param.name: fields[param.name]})
        except pydantic.PydanticSchemaGenerationError:
            shown = annotation.__qualname__ if isinstance(annotation, type) else repr(annotation)
            raise ToolDefinitionError(
                f"{where}: {shown} is not a JSON type; use str, int, float, bool, list, dict, "
                "Literal, Enum, dataclasses or pydantic models"
            ) from None
        except pydantic.PydanticUserError as exc:
            raise ToolDefinitionError(f"{where}: {exc.message}") from None
        except (TypeError, ValueError) as exc:
            # e.g. `model_config` or `model_dump`: names pydantic reserves for itself.
            raise ToolDefinitionError(
                f"{where}: cannot be a tool argument ({exc}); rename it"
            ) from None
    return fields


def _create_model(
    model_name: str, fields: dict[str, Any], *, config: ConfigDict | None = None
) -> type[BaseModel]:
    with warnings.catch_warnings():
        # A parameter named like a BaseModel attribute (`schema`, `json`, `copy`) works:
        # the runner reads arguments by field name. pydantic's warning would only be noise.
        warnings.filterwarnings(
            "ignore", message=r"Field name .* shadows an attribute", category=UserWarning
        )
        return pydantic.create_model(model_name, __config__=config, **fields)


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a docstring into its description and one description per parameter.

    ``docstring_parser`` reads the style it finds: Google (``Args:``), NumPy
    (``Parameters`` underlined), Sphinx (``:param name:``) or Epydoc. A parameter's
    lines are joined into one; its ``*`` or ``**`` is dropped.
    """
    # Its Google reader finds a section only after a line break: a docstring that opens
    # with ``Args:`` would otherwise be all description.
    parsed = docstring_parser.parse(f"\n{doc}")
    params = {
        param.arg_name.lstrip("*"): " ".join(param.description.split())
        for param in parsed.params
        if param.args[0] in _PARAMETER_SECTIONS and param.description
    }
    return (parsed.description or "").strip(), params


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[^0-9a-zA-Z]+", name) if part) or "Tool"
