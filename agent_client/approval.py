"""The ``requires_approval`` option of a proxy: the tool's own, or an override.

A tool says ``@tool(requires_approval=True)`` and its spec carries it; ``remote_tool(...,
requires_approval=)`` and ``remote_tools(requires_approval=)`` override it per proxy.
Each framework adapter maps the result onto its framework's own approval.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["approval_overrides", "check_approval"]


def check_approval(value: object, tool: str) -> bool | None:
    """``value`` as an override for ``tool``: True, False or None (keep the tool's own).

    Raises:
        TypeError: Anything else.
    """
    if value is not None and not isinstance(value, bool):
        raise TypeError(
            f"requires_approval for tool {tool!r} must be True, False or None; got {value!r}"
        )
    return value


def approval_overrides(
    given: bool | Mapping[str, bool] | None, names: list[str]
) -> dict[str, bool | None]:
    """Each tool's override from ``remote_tools(requires_approval=given)``, by name.

    Raises:
        TypeError: ``given`` is not a bool, None or a mapping of bools.
        ValueError: ``given`` names a tool not in ``names``.
    """
    if given is None or isinstance(given, bool):
        return dict.fromkeys(names, given)
    if not isinstance(given, Mapping):
        raise TypeError(
            f"requires_approval must be True, False, None or a mapping of tool names; got {given!r}"
        )
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ValueError(
            f"requires_approval names tools not in this toolset: {', '.join(map(repr, unknown))}; "
            f"its tools: {', '.join(sorted(names)) or '(none)'}"
        )
    return {name: check_approval(given.get(name), name) for name in names}
