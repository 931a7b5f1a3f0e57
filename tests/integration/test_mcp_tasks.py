"""MCP's tasks extension (``io.modelcontextprotocol/tasks``) in ``toolexec mcp``.

The server runs against a real Redis and a real worker that alone serves the
``mcp_tasks`` queue (``tests/integration/mcp_task_tools.py``): as
``python -m toolexec mcp --http PORT`` for the module (most tests: a process's start
takes a second or two), and as ``python -m toolexec mcp`` over stdio where a test needs
a process of its own or the pipe.
mcp 2.3 has no tasks extension of its own, so :class:`TasksClient` is one, in the
client's extension interface: it declares the extension on each request, and
``mcp.Client.call_tool`` resolves a task by polling ``tasks/get``; a test that wants
the task itself asks ``client.session.call_tool(..., allow_claimed=True)``. mcp's client
cannot listen for ``taskIds``, so that test speaks JSON-RPC over the pipe itself.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TextIO

import anyio
import mcp_types as types
import pytest
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import Client, ClientSession, MCPError
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types.version import LATEST_MODERN_VERSION
from pydantic import TypeAdapter

from toolexec import ChildProcess, WorkerProcess, free_port
from toolexec.mcp.tasks import TASKS_EXTENSION

from .polling import wait_until
from .workers import module_worker

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TOOLS = "tests.integration.mcp_task_tools"
#: How long a test waits for a task to reach a state.
SETTLE = 20.0


# -- a client side of the extension -------------------------------------------------------


class CreateTaskResult(types.Result):
    """The ``tools/call`` result that is a task (``resultType: "task"``)."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    poll_interval_ms: int | None = None


class TaskIdParams(types.RequestParams):
    task_id: str


class TaskRequest(types.Request[TaskIdParams, str]):
    """``tasks/get``, ``tasks/cancel``, ... (any method whose params are a task id)."""

    method: str
    params: TaskIdParams
    name_param = "taskId"  # SEP-2663: Mcp-Name carries the task id


_RAW = TypeAdapter(dict[str, Any])


async def task_request(session: ClientSession, method: str, task_id: str) -> dict[str, Any]:
    """Send ``method`` for ``task_id``; its raw result."""
    request = TaskRequest(method=method, params=TaskIdParams(task_id=task_id))
    return await session.send_request(request, _RAW)


async def wait_for(
    session: ClientSession, task_id: str, status: str, *, message: str = ""
) -> dict[str, Any]:
    """Poll ``tasks/get`` until the task is ``status`` (and its message holds ``message``)."""
    with anyio.fail_after(SETTLE):
        while True:
            task = await task_request(session, "tasks/get", task_id)
            if task["status"] == status and message in task.get("statusMessage", ""):
                return task
            await anyio.sleep(0.05)


async def _resolve(created: CreateTaskResult, ctx: ClaimContext) -> types.CallToolResult:
    with anyio.fail_after(SETTLE):
        while True:
            task = await task_request(ctx.session, "tasks/get", created.task_id)
            if task["status"] == "completed":
                return types.CallToolResult.model_validate(task["result"])
            if task["status"] != "working":
                raise RuntimeError(f"task {created.task_id} ended {task['status']}")
            await anyio.sleep(0.05)


class TasksClient(ClientExtension):
    """The tasks extension for ``mcp.Client``: declared on each request; tasks resolved."""

    identifier = TASKS_EXTENSION

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=_resolve)]


# -- the server and its worker --------------------------------------------------------------


@pytest.fixture(scope="module")
def tasks_env(settings_env: dict[str, str]) -> dict[str, str]:
    return {**settings_env, "TOOLEXEC_TOOL_MODULES": TOOLS}


@pytest.fixture(scope="module")
def tasks_worker(
    tasks_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """A prefork worker that alone serves ``mcp_tasks``, for the module."""
    with module_worker(
        tmp_path_factory, "mcp-tasks", env=tasks_env, concurrency=4, queues=("mcp_tasks",)
    ) as worker:
        yield worker


def accepts(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


class Server:
    """A running ``toolexec mcp --http PORT``, and how to start ``toolexec mcp`` over stdio."""

    def __init__(self, env: dict[str, str], url: str, errlog: TextIO) -> None:
        self.env = env
        self.url = url
        self.stdio = StdioServerParameters(
            command=sys.executable, args=["-m", "toolexec", "mcp"], env=env, cwd=ROOT
        )
        self.errlog = errlog

    def client(self, *, tasks: bool = True, stdio: bool = False) -> Client:
        """An ``mcp.Client`` (the 2026-07-28 era), with the tasks extension or without; over
        HTTP to the module's server, or to a new stdio server."""
        return Client(
            self.stdio if stdio else self.url,
            cache=None,
            extensions=[TasksClient()] if tasks else None,
        )

    @asynccontextmanager
    async def handshake(self) -> AsyncIterator[tuple[ClientSession, types.InitializeResult]]:
        """A handshake-era session over HTTP, and its ``initialize`` result."""
        async with (
            streamable_http_client(self.url) as (read, write),
            ClientSession(read, write) as session,
        ):
            yield session, await session.initialize()

    @asynccontextmanager
    async def raw(self) -> AsyncIterator[RawPipe]:
        """A new stdio server's pipe, spoken to in JSON-RPC lines."""
        process = await anyio.open_process(
            [sys.executable, "-m", "toolexec", "mcp"], env=self.env, cwd=ROOT, stderr=self.errlog
        )
        async with process:
            try:
                yield RawPipe(process)
            finally:
                process.terminate()


@pytest.fixture(scope="module")
def http_url(
    tasks_env: dict[str, str],
    tasks_worker: WorkerProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """``toolexec mcp --http PORT`` for the module; its URL."""
    port = free_port()
    process = ChildProcess(
        "mcp-http",
        [sys.executable, "-m", "toolexec", "mcp", "--http", str(port)],
        env={**os.environ, **tasks_env},
        cwd=ROOT,
        log_dir=tmp_path_factory.mktemp("mcp-tasks-http"),
    )
    with process:
        started = wait_until(lambda: accepts(port) or not process.is_running, timeout=30)
        assert started and process.is_running, process.log_tail()
        yield f"http://127.0.0.1:{port}/mcp"


@pytest.fixture
def server(tasks_env: dict[str, str], http_url: str, tmp_path: Path) -> Iterator[Server]:
    with open(tmp_path / "mcp-stdio.log", "w") as errlog:
        yield Server(tasks_env, http_url, errlog)


class RawPipe:
    """JSON-RPC over the server's stdin and stdout, with the 2026-07-28 request envelope."""

    def __init__(self, process: Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self._stdin = process.stdin
        self._stdout = BufferedByteReceiveStream(process.stdout)
        self._ids = iter(range(1, 1_000_000))

    async def send(self, method: str, params: dict[str, Any], *, tasks: bool = True) -> int:
        """Send a request; its id."""
        capabilities = {"extensions": {TASKS_EXTENSION: {}}} if tasks else {}
        params = {
            **params,
            "_meta": {
                types.PROTOCOL_VERSION_META_KEY: LATEST_MODERN_VERSION,
                types.CLIENT_INFO_META_KEY: {"name": "raw", "version": "0"},
                types.CLIENT_CAPABILITIES_META_KEY: capabilities,
            },
        }
        number = next(self._ids)
        message = {"jsonrpc": "2.0", "id": number, "method": method, "params": params}
        await self._stdin.send(json.dumps(message).encode() + b"\n")
        return number

    async def receive(self) -> dict[str, Any]:
        """The next message from the server."""
        with anyio.fail_after(SETTLE):
            line = await self._stdout.receive_until(b"\n", 1 << 24)
        message: dict[str, Any] = json.loads(line)
        return message

    async def response(self, number: int) -> dict[str, Any]:
        """The response to request ``number`` (messages before it are dropped)."""
        while (message := await self.receive()).get("id") != number or "method" in message:
            pass
        return message


# -- tests -----------------------------------------------------------------------------------


def test_a_call_that_declares_the_extension_is_a_task_at_once_working_then_completed(
    server: Server,
) -> None:
    async def main() -> tuple[float, CreateTaskResult, dict[str, Any], dict[str, Any]]:
        async with server.client() as client:
            began = time.monotonic()
            created = await client.session.call_tool(
                "task_steps", {"steps": 8, "pause": 0.1}, allow_claimed=True
            )
            answered = time.monotonic() - began
            assert isinstance(created, CreateTaskResult)
            working = await wait_for(client.session, created.task_id, "working", message="step")
            done = await wait_for(client.session, created.task_id, "completed")
            return answered, created, working, done

    answered, created, working, done = anyio.run(main)

    assert answered < 0.8  # the tool takes 0.8 s; the task came before it ended
    # ttlMs counts from createdAt; the record lives TOOLEXEC_HANDLE_TTL (a day) from its
    # last change, which may already have come (the call started) when the task is told.
    changed = datetime.fromisoformat(created.last_updated_at) - datetime.fromisoformat(
        created.created_at
    )
    assert created.status == "working"
    expected = 86_400_000 + round(changed.total_seconds() * 1000)
    assert created.ttl_ms is not None and abs(created.ttl_ms - expected) <= 1, (
        created.ttl_ms,
        changed,
    )  # ms rounding
    assert len(created.task_id) >= 32  # a toolexec call id: unguessable
    assert working["resultType"] == "complete" and "progress" in working["statusMessage"]
    result = types.CallToolResult.model_validate(done["result"])
    assert not result.is_error and result.structured_content == {"steps": 8}
    assert done["taskId"] == created.task_id and done["lastUpdatedAt"] >= done["createdAt"]


def test_a_client_with_the_extension_gets_results_and_tool_errors_through_the_task(
    server: Server,
) -> None:
    async def main() -> tuple[types.CallToolResult, types.CallToolResult]:
        async with server.client() as client:
            echoed = await client.call_tool("task_echo", {"text": "tides"})
            failed = await client.call_tool("task_fail", {"message": "no tides today"})
            return echoed, failed

    echoed, failed = anyio.run(main)

    assert not echoed.is_error and echoed.structured_content == {"text": "tides"}
    # A tool's error is a completed task whose result is the error result (not "failed").
    assert failed.is_error
    assert (failed.structured_content or {})["error"]["type"] == "ToolExecutionError"
    assert "no tides today" in str(failed.structured_content)


def test_tasks_cancel_stops_the_running_tool_and_the_task_reads_cancelled(
    server: Server, tmp_path: Path
) -> None:
    marker = tmp_path / "finished"
    steps, pause = 20, 0.1  # 2 s, unless cancelled

    async def main() -> tuple[dict[str, Any], dict[str, Any], float]:
        async with server.client() as client:
            created = await client.session.call_tool(
                "task_steps",
                {"steps": steps, "pause": pause, "marker": str(marker)},
                allow_claimed=True,
            )
            began = time.monotonic()
            assert isinstance(created, CreateTaskResult)
            await wait_for(client.session, created.task_id, "working", message="running")
            ack = await task_request(client.session, "tasks/cancel", created.task_id)
            cancelled = await wait_for(client.session, created.task_id, "cancelled")
            return ack, cancelled, began

    ack, cancelled, began = anyio.run(main)

    assert ack == {"resultType": "complete", "_meta": ack.get("_meta")}  # an empty ack
    assert "result" not in cancelled and "cancelled" in cancelled["statusMessage"]
    time.sleep(max(0.0, began + steps * pause + 0.5 - time.monotonic()))
    assert not marker.exists()  # the tool stopped: it never reached its end


def test_unknown_task_ids_and_the_removed_methods_are_the_specs_errors(server: Server) -> None:
    async def main() -> dict[str, int]:
        codes: dict[str, int] = {}
        async with server.client() as client, server.client(tasks=False) as plain:
            for name, session, method in (
                ("unknown get", client.session, "tasks/get"),
                ("unknown cancel", client.session, "tasks/cancel"),
                ("unknown update", client.session, "tasks/update"),
                ("result", client.session, "tasks/result"),
                ("list", client.session, "tasks/list"),
                ("undeclared get", plain.session, "tasks/get"),
            ):
                try:
                    await task_request(session, method, "0" * 32)
                except MCPError as exc:
                    codes[name] = exc.error.code
        return codes

    codes = anyio.run(main)

    assert codes == {
        "unknown get": types.INVALID_PARAMS,
        "unknown cancel": types.INVALID_PARAMS,
        "unknown update": types.INVALID_PARAMS,
        "result": types.METHOD_NOT_FOUND,  # removed by SEP-2663
        "list": types.METHOD_NOT_FOUND,
        "undeclared get": types.MISSING_REQUIRED_CLIENT_CAPABILITY,
    }


def test_a_client_without_the_extension_gets_the_result_as_before(server: Server) -> None:
    async def main() -> tuple[types.CallToolResult, dict[str, Any] | None, Any, int]:
        async with server.client(tasks=False) as modern:
            result = await modern.call_tool("task_steps", {"steps": 2, "pause": 0.05})
            extensions = modern.server_capabilities.extensions
        async with server.handshake() as (session, initialized):
            handshake = await session.call_tool("task_echo", {"text": "tides"})
            assert handshake.structured_content == {"text": "tides"}
            try:
                await task_request(session, "tasks/get", "0" * 32)
            except MCPError as exc:
                code = exc.error.code
        return result, extensions, initialized.capabilities.extensions, code

    result, discovered, initialized, code = anyio.run(main)

    assert not result.is_error and result.structured_content == {"steps": 2}
    assert discovered == {TASKS_EXTENSION: {}}  # advertised to 2026 clients (server/discover)
    assert initialized is None  # not in the handshake era, where the extension is not defined
    assert code == types.METHOD_NOT_FOUND


def test_another_server_process_finds_the_task_by_its_id(server: Server) -> None:
    # Made by a stdio server, found by the HTTP one (through the call's record in Redis).
    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        async with server.client(stdio=True) as first:
            created = await first.session.call_tool(
                "task_steps", {"steps": 5, "pause": 0.1}, allow_claimed=True
            )
            assert isinstance(created, CreateTaskResult)
            async with server.client() as second:
                working = await task_request(second.session, "tasks/get", created.task_id)
                done = await wait_for(second.session, created.task_id, "completed")
        return working, done

    working, done = anyio.run(main)

    assert working["status"] in ("working", "completed")
    assert types.CallToolResult.model_validate(done["result"]).structured_content == {"steps": 5}


def test_a_task_whose_session_and_server_end_the_moment_it_is_created_runs_and_is_found(
    server: Server, tmp_path: Path
) -> None:
    # The task id is returned only once the call is durably queued: the host closes its
    # session at once, the stdio server process that made the task ends with it, and a
    # new session of another server finds the task and its result. Five times over.
    async def main() -> list[tuple[str, dict[str, Any]]]:
        made: list[tuple[str, str]] = []
        for i in range(5):
            marker = str(tmp_path / f"left-{i}")
            async with server.client(stdio=True) as first:
                created = await first.session.call_tool(
                    "task_steps", {"steps": 1, "pause": 0.0, "marker": marker}, allow_claimed=True
                )
                assert isinstance(created, CreateTaskResult)
            made.append((created.task_id, marker))
        async with server.client() as second:
            return [
                (marker, await wait_for(second.session, task_id, "completed"))
                for task_id, marker in made
            ]

    for marker, done in anyio.run(main):
        assert types.CallToolResult.model_validate(done["result"]).structured_content == {
            "steps": 1
        }
        assert Path(marker).read_text() == "done"


def test_a_listen_stream_naming_the_task_gets_its_state_at_each_change(server: Server) -> None:
    async def main() -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
        async with server.raw() as pipe:
            call = await pipe.send(
                "tools/call", {"name": "task_steps", "arguments": {"steps": 4, "pause": 0.15}}
            )
            created = (await pipe.response(call))["result"]
            await pipe.send(
                "subscriptions/listen",
                {"notifications": {"taskIds": [created["taskId"], "0" * 32]}},
            )
            ack = await pipe.receive()
            seen: list[dict[str, Any]] = []
            while not seen or seen[-1]["status"] == "working":
                note = await pipe.receive()
                assert note["method"] == "notifications/tasks", note
                seen.append(note["params"])
            return created, ack, seen

    created, ack, seen = anyio.run(main)

    assert created["resultType"] == "task" and created["status"] == "working"
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert ack["params"]["notifications"]["taskIds"] == [
        created["taskId"]
    ]  # the unknown id left out
    assert {note["taskId"] for note in seen} == {created["taskId"]}
    assert len(seen) >= 3  # where it stood, progress, the end
    assert seen[-1]["status"] == "completed"
    assert seen[-1]["result"]["structuredContent"] == {"steps": 4}


def test_raw_calls_without_the_extension_are_answered_with_their_result(server: Server) -> None:
    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        async with server.raw() as pipe:
            # Capabilities are per request: one that declared the extension changes no other.
            declared = await pipe.send(
                "tools/call", {"name": "task_steps", "arguments": {"steps": 1, "pause": 0.3}}
            )
            assert (await pipe.response(declared))["result"]["resultType"] == "task"
            call = await pipe.send(
                "tools/call", {"name": "task_echo", "arguments": {"text": "tides"}}, tasks=False
            )
            result = (await pipe.response(call))["result"]
            listen = await pipe.send(
                "subscriptions/listen", {"notifications": {"taskIds": ["0" * 32]}}, tasks=False
            )
            refused = await pipe.response(listen)
        return result, refused

    result, refused = anyio.run(main)

    assert result["resultType"] == "complete" and result["structuredContent"] == {"text": "tides"}
    assert refused["error"]["code"] == types.MISSING_REQUIRED_CLIENT_CAPABILITY
    assert refused["error"]["data"]["requiredCapabilities"] == {"extensions": {TASKS_EXTENSION: {}}}
