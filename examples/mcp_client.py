"""An MCP client (the mcp package's own) using the tools through ``toolexec mcp``.

It starts ``python -m toolexec mcp`` as its stdio server, lists the tools, calls
``search``, then ``slow_report`` with a 0.5 s deadline set in the request's ``_meta``,
then ``reindex`` with a progress callback (MCP's ``notifications/progress``). A tool
that needs a person's approval is listed with ``_meta["toolexec/requires_approval"]``,
for the host to ask before it calls. Needs a worker serving ``tasks`` and
``examples.my_tools`` and the same ``TOOLEXEC_*`` settings (passed on to the server).
Runs offline. Prints::

    listChanged: True
    search        {"result": [{"source": "the-red-headed-league.txt"...
    slow_report   isError: tool 'slow_report' timed out after 0.5s
    progress: 3/3 indexed c.txt
    reindex       {"result": 3}
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp_types import TextContent

#: The repository, so ``python -m toolexec`` imports this checkout.
ROOT = Path(__file__).resolve().parents[1]


async def main() -> None:
    # Any MCP host (Claude Desktop, an IDE...) starts the same command: toolexec mcp.
    server = StdioServerParameters(
        command=sys.executable, args=["-m", "toolexec", "mcp"], env=dict(os.environ), cwd=ROOT
    )
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        init = await session.initialize()
        tools = {tool.name for tool in (await session.list_tools()).tools}
        assert {"search", "slow_report", "reindex"} <= tools
        print(
            "listChanged:", bool(init.capabilities.tools and init.capabilities.tools.list_changed)
        )

        found = await session.call_tool("search", {"query": "red-headed league", "limit": 1})
        print(f"{'search':<13} {text(found.content)[:50]}...")

        slow = await session.call_tool(
            "slow_report", {"seconds": 5}, meta={"toolexec/timeout": 0.5}
        )
        print(f"{'slow_report':<13} {'isError: ' if slow.is_error else ''}{text(slow.content)}")

        reports: list[tuple[float, float | None, str | None]] = []

        async def on_progress(done: float, total: float | None, message: str | None) -> None:
            reports.append((done, total, message))

        paths = ["a.txt", "b.txt", "c.txt"]
        indexed = await session.call_tool(
            "reindex", {"paths": paths}, progress_callback=on_progress
        )
        done, total, message = reports[-1]  # the last report always arrives before the result
        print(f"progress: {done:g}/{total:g} {message}")
        print(f"{'reindex':<13} {text(indexed.content)}")


def text(content: Iterable[object]) -> str:
    """The text of a tool result's content blocks."""
    return "".join(block.text for block in content if isinstance(block, TextContent))


if __name__ == "__main__":
    asyncio.run(main())
