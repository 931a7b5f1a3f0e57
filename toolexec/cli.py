"""The ``toolexec`` command: ``worker``, ``tools``, ``call``, ``status``, ``mcp``,
``demo``, ``doctor``.

Built with typer (help, usage errors, shell completion: ``toolexec --install-completion``)
and rich (tables, the progress bar, ``status --watch``). Every command that prints
something a script reads takes ``--json``. Settings come from the ``TOOLEXEC_*``
environment variables (README, "Configuration").

Exit codes (:class:`~toolexec.commands.exits.ExitCode`): 0 done; 1 the tool raised (or
the demo failed, or a doctor check failed); 2 bad arguments or usage; 3 timed out; 4 not
found (no live worker serves the tool, or no live worker at all); 5 Redis or the broker
unreachable; 6 the worker running the call died; 7 the outcome is unknown; 8 a
``TOOLEXEC_*`` setting is invalid; 130 interrupted. A failure is one line on stderr
(``toolexec: ...``), never a traceback.

This module holds the typer app: each command's options, help and a call to its body,
which lives in :mod:`toolexec.commands` (``worker``, ``tools``, ``call``, ``status``,
``demo``), :mod:`toolexec.doctor` or :mod:`toolexec.mcp`.

``main(argv)`` returns the exit code; ``python -m toolexec`` and the ``toolexec``
console script exit with it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal, NoReturn

import redis
import typer

from agent_client import RemoteToolError
from toolexec.commands.call import call_tool, exit_code_for, tool_client
from toolexec.commands.cancel import cancel_call_command
from toolexec.commands.exits import CommandFailed, ExitCode, one_line
from toolexec.commands.status import list_tools, show_status
from toolexec.commands.worker import LOG_LEVELS, run_worker
from toolexec.errors import LaunchError
from toolexec.worker_process import Pool
from wire.errors import ConfigurationError
from wire.settings import Settings

__all__ = ["app", "main"]

app = typer.Typer(
    name="toolexec",
    help=(
        "Run an LLM agent's tools on Celery workers: start workers, list and call tools, watch "
        "them."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

LogFormat = Literal["text", "json"]

JsonOption = Annotated[
    bool, typer.Option("--json", help="Print JSON for scripts instead of tables.")
]


# -- worker --------------------------------------------------------------------------


@app.command(context_settings={"allow_interspersed_args": False})
def worker(
    queues: Annotated[
        list[str] | None,
        typer.Option(
            "-Q",
            "--queues",
            help=(
                "Queues to consume (comma-separated or repeated); default: every queue a tool "
                "names, and default."
            ),
        ),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            "-c", "--concurrency", min=1, help="Pool size; default: Celery's (one per CPU)."
        ),
    ] = None,
    pool: Annotated[Pool, typer.Option("-P", "--pool", help="Execution pool.")] = "prefork",
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=1,
            max=65535,
            help="Serve Prometheus metrics at http://HOST:PORT/metrics.",
        ),
    ] = None,
    metrics_host: Annotated[
        str | None,
        typer.Option(
            "--metrics-host",
            metavar="HOST",
            help=(
                "The address metrics listen on: 0.0.0.0 for a scraper in another container or "
                "host; default: TOOLEXEC_METRICS_HOST, else 127.0.0.1."
            ),
        ),
    ] = None,
    log_format: Annotated[
        LogFormat | None,
        typer.Option(
            "--log-format",
            help=(
                "text (Celery's) or json (one object a line, with call_id, run_id and tool); "
                "default: TOOLEXEC_LOG_FORMAT, else text."
            ),
        ),
    ] = None,
    loglevel: Annotated[
        str | None,
        typer.Option(
            "-l", "--loglevel", help=f"One of {', '.join(LOG_LEVELS)}; default: Celery's (WARNING)."
        ),
    ] = None,
    hostname: Annotated[
        str | None,
        typer.Option(
            "-n", "--hostname", help="Node name, e.g. 'payments@%h'; default: Celery's (celery@%h)."
        ),
    ] = None,
    celery_args: Annotated[
        list[str] | None,
        typer.Argument(help="More `celery worker` options, after `--`.", show_default=False),
    ] = None,
) -> NoReturn:
    """Start a Celery worker that serves the registered tools.

    Task events as TOOLEXEC_TASK_EVENTS says: by default none until a monitor asks for them
    (Flower does; `celery -A executor control enable_events`), `on` from the start.
    The same worker as `celery -A executor worker --without-gossip --without-mingle`,
    with the options given; this process becomes it (same PID). It prints a ready line
    naming its queues and tools, at any log level.
    """
    run_worker(
        queues=queues or [],
        concurrency=concurrency,
        pool=pool,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        log_format=log_format,
        loglevel=loglevel,
        hostname=hostname,
        celery_args=celery_args or [],
    )


# -- tools ---------------------------------------------------------------------------


@app.command()
def tools(as_json: JsonOption = False) -> None:
    """List the tools live workers serve: queue, idempotent, timeout, delivery, workers.

    Exits 4 when no live worker serves any tool.
    """
    list_tools(Settings.from_env(), as_json=as_json)


# -- call ----------------------------------------------------------------------------


@app.command()
def call(
    name: Annotated[str, typer.Argument(help="The tool's name.", show_default=False)],
    arguments: Annotated[
        list[str] | None,
        typer.Argument(
            help=(
                "The arguments: a JSON object, @FILE holding one, - for stdin, or key=value words "
                "(values parse as JSON when they can)."
            ),
            show_default=False,
        ),
    ] = None,
    timeout: Annotated[
        str | None,
        typer.Option(
            "--timeout",
            metavar="S|none",
            help=(
                "Deadline in seconds, or 'none'; default: the tool's, else "
                "TOOLEXEC_DEFAULT_TIMEOUT."
            ),
        ),
    ] = None,
    run_id: Annotated[
        str | None, typer.Option("--run-id", help="The agent run the call belongs to.")
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help='Print {"ok": ..., "result"|"error": ...} on stdout, for scripts.'
        ),
    ] = False,
) -> None:
    """Call one tool and print its result as JSON.

    Exit codes: 0 ok, 1 tool error, 2 bad arguments, 3 timeout, 4 not found, 5 broker
    unavailable, 6 worker lost, 7 outcome unknown, 8 bad settings, 9 cancelled.
    """
    with tool_client(Settings.from_env()) as client:
        call_tool(
            client,
            name,
            arguments or [],
            timeout=timeout,
            run_id=run_id,
            as_json=as_json,
            stdin=sys.stdin,
            out=sys.stdout,
            err=sys.stderr,
        )


# -- cancel --------------------------------------------------------------------------


@app.command()
def cancel(
    call_id: Annotated[
        str, typer.Argument(help="The call's id (CallHandle.id).", show_default=False)
    ],
    as_json: JsonOption = False,
) -> None:
    """Cancel a call: a queued one never starts, a running one is stopped.

    Exit codes: 0 cancelled, 1 the call had ended already (nothing to cancel), 5 Redis
    unavailable, 8 bad settings.
    """
    with tool_client(Settings.from_env()) as client:
        cancel_call_command(client, call_id, as_json=as_json, out=sys.stdout)


# -- status --------------------------------------------------------------------------


@app.command()
def status(
    as_json: JsonOption = False,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch", help="Refresh until interrupted (with --json: one object per line)."
        ),
    ] = False,
    interval: Annotated[
        float, typer.Option("--interval", min=0.1, help="Seconds between refreshes with --watch.")
    ] = 2.0,
    count: Annotated[
        int | None,
        typer.Option("--count", min=1, help="With --watch: stop after this many snapshots."),
    ] = None,
    only: Annotated[
        str | None,
        typer.Option(
            "--worker",
            help="Only this worker (node name, host name or worker id); exits 4 if it is not live.",
        ),
    ] = None,
) -> None:
    """Show workers, queue depths, calls per tool (last minute and hour) and dead letters.

    Workers count calls as they end. "Timed out" is a call shed because it expired before it started, or stopped at its tool's hard limit; a call whose caller stopped waiting at its deadline while the tool ran on counts as done (or failed) when the tool finishes, since the worker cannot know that its caller left.

    Exits 5 when the queues' broker cannot be read, after showing the rest. With --worker only that worker's health decides: 4 when it is not live, else 0.
    """  # noqa: E501
    show_status(
        Settings.from_env(), as_json=as_json, watch=watch, interval=interval, count=count, only=only
    )


# -- mcp, demo -----------------------------------------------------------------------


@app.command()
def mcp(
    http: Annotated[
        int | None,
        typer.Option(
            "--http", metavar="PORT", help="Serve streamable HTTP on PORT instead of stdio."
        ),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address to bind with --http.")] = "127.0.0.1",
    approve_all: Annotated[
        bool,
        typer.Option(
            "--approve-all",
            help=(
                "Send calls of tools that require approval without asking the host (the operator "
                "approves them all)."
            ),
        ),
    ] = False,
) -> None:
    """Serve the live tools as an MCP server (stdio, or streamable HTTP with --http PORT).

    A tool that requires approval is sent only once the host's user approved the call
    (MCP elicitation); a host that cannot be asked is refused, unless --approve-all.
    """
    from agent_client.frameworks import MissingExtra

    try:
        from toolexec.mcp import serve_http, serve_stdio
    except MissingExtra as exc:
        raise CommandFailed(str(exc), ExitCode.BAD_ARGUMENTS) from None
    settings = Settings.from_env()
    if http is None:
        code = serve_stdio(settings, approve_all=approve_all)
    else:
        code = serve_http(settings, host, http, approve_all=approve_all)
    raise typer.Exit(code)


@app.command()
def ui(
    host: Annotated[
        str,
        typer.Option("--host", help="Address to bind; off loopback it needs TOOLEXEC_UI_TOKEN."),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to serve on.")] = 8777,
) -> None:
    """Serve the web view of agent runs: recent runs, each run's calls on a timeline, and
    the live fleet (needs the toolexec[ui] extra)."""
    try:
        from toolexec.ui.app import serve
    except ImportError as exc:
        raise CommandFailed(
            f"toolexec ui needs the toolexec[ui] extra: pip install 'toolexec[ui]' ({exc})",
            ExitCode.BAD_ARGUMENTS,
        ) from None
    serve(Settings.from_env(), host, port)


@app.command()
def demo(
    logs: Annotated[
        Path | None,
        typer.Option(
            "--logs", help="Where to keep the logs if it fails; default: a new temporary directory."
        ),
    ] = None,
) -> None:
    """Start a private Redis and two workers, run a scripted agent, stop everything.

    Exits 1 if it fails, saying where it kept the logs of the processes it started.
    """
    from toolexec.commands.demo import run_demo

    raise typer.Exit(run_demo(keep_logs_in=logs))


@app.command()
def doctor(
    as_json: JsonOption = False,
    celery_app: Annotated[
        str | None,
        typer.Option(
            "--app",
            metavar="MODULE[:ATTR]",
            help="The workers' Celery app, if not toolexec's own (what they pass to celery -A).",
        ),
    ] = None,
) -> None:
    """Check a deployment against docs/security.md and say what to fix; exits 1 if a check fails."""
    from toolexec.doctor import main as run_doctor

    argv = [*(["--json"] if as_json else []), *(["--app", celery_app] if celery_app else [])]
    raise typer.Exit(run_doctor(argv))


# -- running the command ---------------------------------------------------------------


def _status_of(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``toolexec`` command with ``argv`` (default: ``sys.argv[1:]``); return
    its exit code."""
    if not logging.getLogger().handlers:
        # A one-shot command: the client's warnings (a lost connection it retries) would
        # add lines to the one that says what failed; errors still show.
        logging.basicConfig(level=logging.ERROR, format="toolexec: %(name)s: %(message)s")
    command = typer.main.get_command(app)
    try:
        command.main(
            args=list(argv) if argv is not None else None,
            prog_name="toolexec",
            standalone_mode=True,
        )
    except SystemExit as exit_:
        return _status_of(exit_.code)
    except CommandFailed as failed:
        return _fail(str(failed), failed.code)
    except ConfigurationError as exc:
        return _fail(str(exc), ExitCode.BAD_SETTINGS)
    except RemoteToolError as exc:
        return _fail(f"{type(exc).__name__}: {exc}", exit_code_for(exc))
    except redis.RedisError as exc:
        return _fail(f"Redis is unreachable: {exc}", ExitCode.BROKER_UNAVAILABLE)
    except LaunchError as exc:
        return _fail(str(exc).splitlines()[0], ExitCode.TOOL_ERROR)
    except KeyboardInterrupt:
        return int(ExitCode.INTERRUPTED)
    return 0


def _fail(message: str, code: ExitCode) -> int:
    print(f"toolexec: {one_line(message)}", file=sys.stderr, flush=True)
    return int(code)


if __name__ == "__main__":
    raise SystemExit(main())
