"""How deeply a call's arguments or a tool's result may nest: the one rule for both sides.

JSON nested deeper than :data:`MAX_DEPTH` arrays and objects is refused wherever it would
enter toolexec: the client refuses such arguments (``ToolArgumentsInvalid``), a worker's
main process refuses a message carrying them before any pool sees it (Python's pickling
for a prefork child, its JSON parsers and pydantic all have recursion limits of their
own, at a few hundred levels, and fail far from where a caller could be told), and a
worker refuses such a result (``UnserializableResult``) before it is sent.

:func:`json_depth` measures the JSON text, not the decoded value: a few passes of C
code (``str.count``, three regular expressions, ``itertools.accumulate``) whatever its size,
and none at all for text with fewer brackets than the limit.
"""

from __future__ import annotations

import itertools
import re

__all__ = ["MAX_DEPTH", "json_depth", "too_deep"]

#: The deepest nesting of arrays and objects allowed in arguments and results.
MAX_DEPTH = 100

_ESCAPE = re.compile(r"\\.", re.DOTALL)  # a backslash and what it escapes
_STRING = re.compile(r'"[^"]*"')  # once escapes are gone, a string holds no quote
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def json_depth(text: str | bytes) -> int:
    """The deepest nesting of arrays and objects in the JSON ``text``; 0 for a scalar."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if "\\" in text:
        text = _ESCAPE.sub("", text)
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0)


def too_deep(text: str | bytes, *, around: int = 0) -> bool:
    """Whether the JSON ``text`` nests deeper than :data:`MAX_DEPTH`, once ``around``
    levels that wrap the value measured (an outcome's object around its result) are
    taken off."""
    opening = (
        text.count("[") + text.count("{")
        if isinstance(text, str)
        else text.count(b"[") + text.count(b"{")
    )
    return opening > MAX_DEPTH + around and json_depth(text) > MAX_DEPTH + around
