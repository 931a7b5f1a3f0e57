"""The ``toolexec`` command: ``toolexec demo``, ``toolexec tools``, ``toolexec call``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``toolexec`` console script."""
    parser = argparse.ArgumentParser(prog="toolexec", description="Run an LLM agent's tools on Celery workers.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="start a private Redis and workers, run a scripted agent, stop everything")
    commands.add_parser("tools", help="list the tools live workers serve (reads TOOLEXEC_* settings)")
    call = commands.add_parser("call", help="call one tool and print its result as JSON")
    call.add_argument("tool")
    call.add_argument("arguments", nargs="?", default="{}", help="JSON object of arguments")
    call.add_argument("--timeout", type=float, default=None, help="deadline in seconds")
    args = parser.parse_args(argv)

    if args.command == "demo":
        from executor.demo import run_demo

        return run_demo()

    from agent_client import RemoteToolError, remote_tool, remote_tools

    try:
        if args.command == "tools":
            for remote in remote_tools():
                flags = " idempotent" if remote.idempotent else ""
                print(f"{remote.name:<20} queue={remote.spec.queue}{flags}  {remote.description.splitlines()[0]}")
            return 0
        arguments = json.loads(args.arguments)
        remote = remote_tool(args.tool)
        result = remote.invoke_sync(arguments, timeout=args.timeout if args.timeout is not None else remote.timeout)
        print(json.dumps(result, indent=2, ensure_ascii=False))
        return 0
    except json.JSONDecodeError as exc:
        print(f"toolexec: arguments are not JSON: {exc}", file=sys.stderr)
        return 2
    except RemoteToolError as exc:
        print(f"toolexec: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
