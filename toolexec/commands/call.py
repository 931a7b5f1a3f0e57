"""``toolexec call``: run one tool, print its result, exit with a code a script can test.

The result is printed as JSON on stdout. With ``--json`` stdout gets one object either
way: ``{"ok": true, "tool": ..., "result": ...}`` or ``{"ok": false, "tool": ...,
"error": {"type": ..., "message": ..., "exit_code": ...}}``. A failure is also said on
one line on stderr, and the exit code names it (:mod:`toolexec.commands.exits`). On a
terminal, a tool that reports progress (``executor.report_progress``) draws a progress
bar on stderr while it runs.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from agent_client import RemoteToolError, ToolClient, errors, remote_tool
from agent_client.progress import ProgressEvent
from toolexec.commands.arguments import parse_arguments, parse_timeout
from toolexec.commands.exits import CommandFailed, ExitCode
from wire.settings import Settings

__all__ = ["HARD_TIMEOUT_TYPE", "call_tool", "exit_code_for", "tool_client"]

#: The remote type of a call stopped at its tool's hard limit (executor.runner).
HARD_TIMEOUT_TYPE = "ToolHardTimeout"

#: Error class of the agent's error tree -> exit code, most specific first.
_CODES: tuple[tuple[type[RemoteToolError], ExitCode], ...] = (
    (errors.ToolOutcomeUnknown, ExitCode.OUTCOME_UNKNOWN),
    (errors.ToolArgumentsInvalid, ExitCode.BAD_ARGUMENTS),
    (errors.ToolTimeoutError, ExitCode.TIMEOUT),
    (errors.ToolNotFound, ExitCode.NOT_FOUND),
    (errors.BrokerUnavailable, ExitCode.BROKER_UNAVAILABLE),
    (errors.WorkerLost, ExitCode.WORKER_LOST),
    (errors.ToolCancelled, ExitCode.CANCELLED),
)


@contextmanager
def tool_client(settings: Settings) -> Iterator[ToolClient]:
    """A :class:`ToolClient` of ``settings``, closed on exit.

    Raises:
        CommandFailed: The client cannot publish to the settings' broker (exit code 8).
    """
    try:
        client = ToolClient(settings)
    except ValueError as exc:  # a broker the client cannot publish to
        raise CommandFailed(str(exc), ExitCode.BAD_SETTINGS) from None
    try:
        yield client
    finally:
        client.close()


def exit_code_for(error: RemoteToolError) -> ExitCode:
    """The exit code of a call that raised ``error`` (a hard timeout is a timeout)."""
    if isinstance(error, errors.ToolExecutionError):
        return ExitCode.TIMEOUT if error.remote_type == HARD_TIMEOUT_TYPE else ExitCode.TOOL_ERROR
    for kind, code in _CODES:
        if isinstance(error, kind):
            return code
    return ExitCode.TOOL_ERROR


def call_tool(
    client: ToolClient,
    name: str,
    words: Sequence[str],
    *,
    timeout: str | None,
    run_id: str | None,
    as_json: bool,
    stdin: TextIO,
    out: TextIO,
    err: TextIO,
) -> None:
    """Run ``toolexec call`` and print the result.

    Raises:
        CommandFailed: The call did not return a result; the code names why.
    """
    try:
        limit = parse_timeout(timeout)
        arguments = parse_arguments(words, stdin=stdin)
        started = time.monotonic()  # the deadline counts from here: the catalog read is part of it
        remote = remote_tool(name, timeout=limit, client=client)
        with _progress_bar(err, enabled=not as_json) as on_progress:
            result = remote.invoke_sync(
                arguments, run_id=run_id, on_progress=on_progress, started=started
            )
    except CommandFailed as failed:
        _print_failure(
            out, name, failed.code.name.lower(), str(failed), failed.code, as_json=as_json
        )
        raise
    except RemoteToolError as error:
        code = exit_code_for(error)
        _print_failure(
            out, name, type(error).__name__, str(error), code, as_json=as_json, error=error
        )
        raise CommandFailed(f"{type(error).__name__}: {error}", code) from None
    except ValueError as exc:  # a bad option value the proxy refused
        _print_failure(out, name, "ValueError", str(exc), ExitCode.BAD_ARGUMENTS, as_json=as_json)
        raise CommandFailed(str(exc), ExitCode.BAD_ARGUMENTS) from None
    document = {"ok": True, "tool": name, "result": result} if as_json else result
    print(
        json.dumps(document, indent=None if as_json else 2, ensure_ascii=False),
        file=out,
        flush=True,
    )


def _print_failure(
    out: TextIO,
    tool: str,
    type_name: str,
    message: str,
    code: ExitCode,
    *,
    as_json: bool,
    error: RemoteToolError | None = None,
) -> None:
    if not as_json:
        return
    described: dict[str, Any] = {"type": type_name, "message": message, "exit_code": int(code)}
    if isinstance(error, errors.ToolExecutionError):
        described |= {"remote_type": error.remote_type, "remote_message": error.remote_message}
    print(
        json.dumps({"ok": False, "tool": tool, "error": described}, ensure_ascii=False),
        file=out,
        flush=True,
    )


@contextmanager
def _progress_bar(
    err: TextIO, *, enabled: bool
) -> Iterator[Callable[[ProgressEvent], None] | None]:
    """A callback drawing the tool's progress on ``err`` when it is a terminal, else None."""
    if not enabled or not err.isatty():
        yield None
        return
    console = Console(file=err, stderr=err is sys.stderr)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[shown]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task: list[TaskID] = []

        def on_progress(event: ProgressEvent) -> None:
            shown = (
                f"{event.done:g}/{event.total:g}" if event.total is not None else f"{event.done:g}"
            )
            description = event.message or "running"
            if not task:
                task.append(progress.add_task(description, total=event.total, shown=shown))
            progress.update(
                task[0],
                completed=event.done,
                total=event.total,
                description=description,
                shown=shown,
            )

        yield on_progress
