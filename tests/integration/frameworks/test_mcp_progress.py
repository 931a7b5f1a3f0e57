"""``toolexec mcp`` forwards a tool's progress as ``notifications/progress``, before its result.

The server runs as a stdio subprocess, reached with mcp's own ``ClientSession``; the
tool reports progress on a worker that alone serves the ``observe`` queue
(``tests/integration/observe_tools.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp import ClientSession
from mcp.client.session import IncomingMessage
from mcp.client.stdio import stdio_client

from toolexec import WorkerProcess

from .test_mcp import StdioServer

pytestmark = pytest.mark.integration


@pytest.fixture
def server(
    settings_env: dict[str, str], observe_worker: WorkerProcess, tmp_path: Path
) -> Iterator[StdioServer]:
    """``toolexec mcp`` over stdio, its stderr in a file."""
    with open(tmp_path / "mcp-stdio.log", "w") as errlog:
        yield StdioServer(settings_env, errlog)


def test_a_client_that_asks_for_progress_gets_each_report_before_the_result(
    server: StdioServer,
) -> None:
    received: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        received.append((progress, total, message))

    async def call(session: ClientSession) -> tuple[types.CallToolResult, int]:
        result = await session.call_tool(
            "observe_steps", {"steps": 10, "pause": 0.05}, progress_callback=on_progress
        )
        return result, len(received)

    result, seen_before_result = server.run(call)

    assert not result.is_error and result.structured_content == {"steps": 10}
    assert received and seen_before_result == len(received)
    progress = [value for value, _, _ in received]
    assert progress == sorted(set(progress))  # MCP wants it to increase
    assert received[-1] == (10, 10, "step 10")


def test_a_client_that_asks_for_no_progress_is_sent_none(server: StdioServer) -> None:
    # Every notification reaches the session's message handler, asked for or not; a call
    # that asked counts its own through its callback. A call between two that asked
    # must add nothing to the handler's count.
    handled: list[float] = []
    called: list[float] = []

    async def handler(message: IncomingMessage) -> None:
        if isinstance(message, types.ProgressNotification):
            handled.append(message.params.progress)

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        called.append(progress)

    async def main() -> None:
        async with (
            stdio_client(server.params, errlog=server.errlog) as (read, write),
            ClientSession(read, write, message_handler=handler) as session,
        ):
            await session.initialize()
            steps = {"steps": 10, "pause": 0.05}
            await session.call_tool("observe_steps", steps, progress_callback=on_progress)
            await session.call_tool("observe_steps", steps)  # no progressToken
            await session.call_tool("observe_steps", steps, progress_callback=on_progress)
            with anyio.fail_after(10):  # both asking calls' last reports, seen both ways
                while handled.count(10) < 2 or called.count(10) < 2:
                    await anyio.sleep(0.01)

    anyio.run(main)

    assert called.count(10) == 2
    assert sorted(handled) == sorted(called)  # nothing for the call that did not ask
