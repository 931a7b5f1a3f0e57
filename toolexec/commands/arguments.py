"""What ``toolexec call`` reads from its command line: the arguments and ``--timeout``.

A call's arguments are one JSON object, built from the words after the tool's name:

* ``'{"query": "fox"}'`` — a JSON object;
* ``@args.json`` — a file holding one (any size the settings allow:
  ``TOOLEXEC_MAX_ARGUMENT_BYTES``; a command line holds at most 128 KiB per word);
* ``-`` — standard input holding one;
* ``query=fox limit=3`` — one argument each: the value is parsed as JSON when it parses
  (``3``, ``true``, ``[1, 2]``, ``"3"``), and is the text itself when it does not.

At most one of the first three; ``key=value`` words are applied after it, in order,
so ``@base.json limit=3`` overrides one field of a file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from agent_client.deadline import NOT_SET, Timeout
from toolexec.commands.exits import CommandFailed, ExitCode
from wire.models import MAX_TIMEOUT

__all__ = ["NO_DEADLINE_WORDS", "parse_arguments", "parse_timeout"]

#: ``--timeout`` words meaning "no deadline".
NO_DEADLINE_WORDS = frozenset({"none", "off"})


def parse_timeout(text: str | None) -> Timeout:
    """``--timeout``: seconds (a positive number), ``none`` (no deadline), or absent (NOT_SET).

    Raises:
        CommandFailed: Anything else (exit code 2).
    """
    if text is None:
        return NOT_SET
    if text.strip().lower() in NO_DEADLINE_WORDS:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0 or seconds > MAX_TIMEOUT:
        raise CommandFailed(
            f"--timeout must be a positive number of seconds, at most {MAX_TIMEOUT:.0f} (366 "
            f"days), or 'none', not {text!r}",
            ExitCode.BAD_ARGUMENTS,
        )
    return seconds


def parse_arguments(words: Sequence[str], *, stdin: TextIO) -> dict[str, Any]:
    """The arguments object the words after the tool's name describe (module docstring).

    Raises:
        CommandFailed: A word is none of the forms, a source is not a JSON object, a
            file cannot be read, or two whole-object sources were given (exit code 2).
    """
    arguments: dict[str, Any] = {}
    whole: str | None = None
    pairs: list[tuple[str, Any]] = []
    for word in words:
        if word == "-" or word.startswith("@") or word.lstrip().startswith(("{", "[")):
            if whole is not None:
                raise CommandFailed(
                    f"give the arguments as one JSON object, @file or -: got {_shown(whole)} and "
                    f"{_shown(word)}",
                    ExitCode.BAD_ARGUMENTS,
                )
            whole = word
            arguments = _object(_read(word, stdin), source=_source(word))
            continue
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise CommandFailed(
                f"argument {_shown(word)} is not a JSON object, key=value, @file or -",
                ExitCode.BAD_ARGUMENTS,
            )
        pairs.append((key, _value(value)))
    arguments.update(pairs)
    return arguments


def _read(word: str, stdin: TextIO) -> str:
    if word == "-":
        return stdin.read()
    if word.startswith("@"):
        path = Path(word[1:])
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandFailed(
                f"cannot read the arguments file {str(path)!r}: {exc}", ExitCode.BAD_ARGUMENTS
            ) from None
    return word


def _source(word: str) -> str:
    if word == "-":
        return "standard input"
    if word.startswith("@"):
        return f"the file {word[1:]!r}"
    return "the arguments"


def _object(text: str, *, source: str) -> dict[str, Any]:
    try:
        value = json.loads(text, parse_constant=_not_json)
    except ValueError as exc:
        raise CommandFailed(f"{source}: not JSON ({exc})", ExitCode.BAD_ARGUMENTS) from None
    if not isinstance(value, dict):
        raise CommandFailed(
            f"{source}: must be a JSON object, not a JSON {type(value).__name__}",
            ExitCode.BAD_ARGUMENTS,
        )
    return value


def _value(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_not_json)
    except ValueError:
        return text


def _not_json(constant: str) -> Any:
    # Python's json reads NaN and Infinity; JSON has neither.
    raise ValueError(f"{constant} is not JSON")


def _shown(word: str, limit: int = 40) -> str:
    return repr(word if len(word) <= limit else word[:limit] + "...")
