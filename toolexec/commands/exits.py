"""The exit codes of the ``toolexec`` command, and the failure that carries one.

| code | meaning |
|---|---|
| 0 | done |
| 1 | the tool raised (``call``); the demo failed (``demo``); a check failed (``doctor``); the call had ended, nothing to cancel (``cancel``) |
| 2 | bad arguments or usage: an unknown option, arguments that are not a JSON object or do not fit the tool's schema, a bad ``--timeout`` |
| 3 | timed out: the call's deadline passed, or the tool ran past its hard limit |
| 4 | not found: no live worker serves the tool (``call``), no live worker at all (``tools``), no live worker of that name (``status --worker``) |
| 5 | Redis (the broker) cannot be reached |
| 6 | the worker running the call died |
| 7 | the outcome is unknown: the call may have reached Redis and no reply came in time (it may have run) |
| 8 | a ``TOOLEXEC_*`` setting is invalid (a bad value, a URL of a kind toolexec cannot use) |
| 9 | the call was cancelled (``call``) |
| 130 | interrupted (Ctrl-C) |
"""  # noqa: E501

from __future__ import annotations

import enum

__all__ = ["CommandFailed", "ExitCode", "one_line"]


class ExitCode(enum.IntEnum):
    """What a ``toolexec`` process's exit status means (the table in the module docstring)."""

    OK = 0
    TOOL_ERROR = 1
    BAD_ARGUMENTS = 2
    TIMEOUT = 3
    NOT_FOUND = 4
    BROKER_UNAVAILABLE = 5
    WORKER_LOST = 6
    OUTCOME_UNKNOWN = 7
    BAD_SETTINGS = 8
    CANCELLED = 9
    INTERRUPTED = 130


class CommandFailed(Exception):
    """A command ends with a one-line message on stderr and ``code`` as its exit status.

    Attributes:
        code: The exit status.
    """

    def __init__(self, message: str, code: ExitCode) -> None:
        super().__init__(message)
        self.code = code


def one_line(text: str) -> str:
    """``text`` on one line, as a failure is said on stderr (``toolexec: ...``)."""
    return " ".join(text.split())
