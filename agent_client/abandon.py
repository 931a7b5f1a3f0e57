"""The ``on_abandon`` option of a call: what happens to it when its caller stops waiting.

A tool says ``@tool(on_abandon="cancel")`` (or ``"leave"``, the default) and its spec
carries it; the agent side overrides it per proxy (``remote_tool(..., on_abandon=)``),
per toolset (``remote_tools(on_abandon=)``: one value, or one per tool name) and per call
(``invoke(..., on_abandon=)``, ``submit``). The nearest one set wins: the call's, then the
proxy's, then the tool's own. ``"cancel"`` cancels the call when its deadline passes or its
awaiting task is cancelled (a queued copy never starts, a running tool is stopped);
``"leave"`` lets it run on, its outcome dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, cast

from wire.models import ToolSpec

__all__ = ["OnAbandon", "check_on_abandon", "on_abandon_overrides", "with_on_abandon"]

OnAbandon = Literal["leave", "cancel"]
_CHOICES = ("leave", "cancel")


def check_on_abandon(value: object, tool: str) -> OnAbandon | None:
    """``value`` as an override for ``tool``: "leave", "cancel" or None (keep the tool's own).

    Raises:
        ValueError: Anything else.
    """
    if value is not None and value not in _CHOICES:
        raise ValueError(
            f"on_abandon for tool {tool!r} must be 'leave', 'cancel' or None; got {value!r}"
        )
    return cast("OnAbandon | None", value)


def on_abandon_overrides(
    given: OnAbandon | Mapping[str, OnAbandon] | None, names: list[str]
) -> dict[str, OnAbandon | None]:
    """Each tool's override from ``remote_tools(on_abandon=given)``, by name.

    Raises:
        TypeError: ``given`` is neither a value nor a mapping.
        ValueError: A value that is not "leave", "cancel" or None, or ``given`` names a
            tool not in ``names``.
    """
    if given is None or isinstance(given, str):
        return {name: check_on_abandon(given, name) for name in names}
    if not isinstance(given, Mapping):
        raise TypeError(
            f"on_abandon must be 'leave', 'cancel', None or a mapping of tool names; got {given!r}"
        )
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ValueError(
            f"on_abandon names tools not in this toolset: {', '.join(map(repr, unknown))}; "
            f"its tools: {', '.join(sorted(names)) or '(none)'}"
        )
    return {name: check_on_abandon(given.get(name), name) for name in names}


def with_on_abandon(spec: ToolSpec, on_abandon: OnAbandon | None) -> ToolSpec:
    """``spec`` as a call sends it: with ``on_abandon`` in place of the tool's own when set."""
    if on_abandon is None or on_abandon == spec.on_abandon:
        return spec
    return spec.model_copy(update={"on_abandon": on_abandon})
