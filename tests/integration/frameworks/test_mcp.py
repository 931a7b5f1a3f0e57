"""``toolexec mcp`` against the mcp package's own clients and a real worker.

Every test reaches the server as an MCP host would: ``python -m toolexec mcp`` started
as a stdio subprocess (``mcp.client.stdio.stdio_client`` + ``ClientSession``, the
handshake protocol era), or ``python -m toolexec mcp --http PORT`` reached with
``streamable_http_client``. One stdio subprocess is one MCP session. ``mcp.Client``,
which negotiates the 2026-07-28 era by default, checks the other era.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO, TypeVar, cast

import anyio
import mcp_types as types
import pytest
import redis
from mcp import Client, ClientSession
from mcp.client.session import IncomingMessage
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import Subscription
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from agent_client import ToolClient, remote_tools
from tests.integration.frameworks.examples import assert_example_prints_its_docstring
from toolexec import ChildProcess, WorkerProcess, free_port
from toolexec.mcp import (
    CALL_ID_META_KEY,
    REQUIRES_APPROVAL_META_KEY,
    RUN_ID_META_KEY,
    TIMEOUT_META_KEY,
)

from ..conftest import WorkerFactory
from ..polling import wait_until
from .conftest import ROOT

pytestmark = pytest.mark.integration

T = TypeVar("T")

#: How late past its deadline a call's error may come back (a loaded machine).
DEADLINE_SLACK = 0.75
#: The joining worker's tool, alone on its own queue (``mcp_extra``).
EXTRA_TOOL = "mcp_extra_echo"
EXTRA_MODULES = "tests.integration.mcp_extra_tools"


# -- launching the server and talking to it ------------------------------------------------


class StdioServer:
    """How a client starts ``toolexec mcp`` over stdio; each session is a new subprocess."""

    def __init__(self, env: dict[str, str], errlog: TextIO) -> None:
        self.params = StdioServerParameters(
            command=sys.executable, args=["-m", "toolexec", "mcp"], env=env, cwd=ROOT
        )
        self.errlog = errlog

    @asynccontextmanager
    async def session(self, notices: Notices | None = None) -> AsyncIterator[ClientSession]:
        """An initialized handshake-era session with a fresh server process."""
        handler = notices.handler if notices is not None else None
        async with (
            stdio_client(self.params, errlog=self.errlog) as (read, write),
            ClientSession(read, write, message_handler=handler) as session,
        ):
            await session.initialize()
            yield session

    def run(self, body: Callable[[ClientSession], Awaitable[T]]) -> T:
        """``await body(session)`` in one new session; its value."""

        async def main() -> T:
            async with self.session() as session:
                return await body(session)

        return anyio.run(main)


class Notices:
    """Counts tool list changes a client was told about, and waits for the next one."""

    def __init__(self) -> None:
        self.count = 0
        self._waited = 0
        self._arrived = anyio.Event()

    def add(self) -> None:
        self.count += 1
        self._arrived.set()

    async def handler(self, message: IncomingMessage) -> None:
        """A ``ClientSession`` message handler: counts ``notifications/tools/list_changed``."""
        if isinstance(message, types.ToolListChangedNotification):
            self.add()

    async def follow(self, subscription: Subscription) -> None:
        """Count the events of a 2026 ``subscriptions/listen`` stream."""
        async for _ in subscription:
            self.add()

    async def next(self) -> None:
        """Wait for a notice that was not waited for yet."""
        while self._waited >= self.count:
            await self._arrived.wait()
            self._arrived = anyio.Event()
        self._waited = self.count


@pytest.fixture
def stdio(
    framework_env: dict[str, str], framework_worker: WorkerProcess, tmp_path: Path
) -> Iterator[StdioServer]:
    """``toolexec mcp`` over stdio with the framework worker's settings; its stderr in a file."""
    with open(tmp_path / "mcp-stdio.log", "w") as errlog:
        yield StdioServer(framework_env, errlog)


def tcp_listeners(port: int) -> set[str]:
    """The local addresses (hex, as in ``/proc/net/tcp*``) listening on ``port``."""
    found = set()
    for table in (Path("/proc/net/tcp"), Path("/proc/net/tcp6")):
        if not table.exists():  # no IPv6 on this machine
            continue
        with table.open() as rows:
            for row in list(rows)[1:]:
                local, state = row.split()[1], row.split()[3]
                address, hex_port = local.split(":")
                if int(hex_port, 16) == port and state == "0A":  # 0A: LISTEN
                    found.add(address)
    return found


def accepts(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


class HttpServer:
    """A running ``toolexec mcp --http PORT``."""

    def __init__(self, process: ChildProcess, port: int) -> None:
        self.process = process
        self.port = port
        self.url = f"http://127.0.0.1:{port}/mcp"

    def threads(self) -> int:
        """How many threads the server process runs now."""
        return len(os.listdir(f"/proc/{self.process.pid}/task"))


@pytest.fixture(scope="module")
def http_server(
    framework_env: dict[str, str],
    framework_worker: WorkerProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[HttpServer]:
    """``toolexec mcp --http PORT`` with the default host, for the module."""
    port = free_port()
    process = ChildProcess(
        "mcp-http",
        [sys.executable, "-m", "toolexec", "mcp", "--http", str(port)],
        env={**os.environ, **framework_env},
        cwd=ROOT,
        log_dir=tmp_path_factory.mktemp("mcp-http"),
    )
    with process:
        assert wait_until(lambda: accepts(port) or not process.is_running, timeout=30), (
            process.log_tail()
        )
        assert process.is_running, process.log_tail()
        yield HttpServer(process, port)


@asynccontextmanager
async def http_session(url: str, notices: Notices | None = None) -> AsyncIterator[ClientSession]:
    """An initialized handshake-era session over streamable HTTP (one ``Mcp-Session-Id``)."""
    handler = notices.handler if notices is not None else None
    async with (
        streamable_http_client(url) as (read, write),
        ClientSession(read, write, message_handler=handler) as session,
    ):
        await session.initialize()
        yield session


def meta(values: dict[str, Any]) -> types.RequestParamsMeta:
    """A request ``_meta`` with toolexec's keys (mcp types it as a TypedDict of extra items)."""
    return cast(types.RequestParamsMeta, values)


def text(result: types.CallToolResult) -> str:
    """The text blocks of a tool result."""
    return "".join(block.text for block in result.content if isinstance(block, types.TextContent))


def executions(runs: tuple[str, redis.Redis]) -> int:
    """How many times ``idem_count`` ran under the test's counter."""
    counter, store = runs
    return int(store.get(counter) or 0)


# -- tools/list ------------------------------------------------------------------------------


def test_the_tool_list_is_the_live_catalog_with_each_tools_json_schema(
    stdio: StdioServer, framework_client: ToolClient
) -> None:
    async def body(
        session: ClientSession,
    ) -> tuple[types.ServerCapabilities | None, list[types.Tool]]:
        return session.server_capabilities, (await session.list_tools()).tools

    capabilities, listed = stdio.run(body)

    catalog = remote_tools()
    assert [(t.name, t.description, t.input_schema) for t in listed] == [
        (r.name, r.description, r.parameters) for r in catalog
    ]
    assert capabilities is not None and capabilities.tools is not None
    assert capabilities.tools.list_changed is True
    hints = {t.name: t.annotations.idempotent_hint if t.annotations else None for t in listed}
    assert hints["idem_count"] is True and hints["search"] is None
    approvals = {t.name for t in listed if (t.meta or {}).get(REQUIRES_APPROVAL_META_KEY) is True}
    assert approvals == {r.name for r in catalog if r.requires_approval} == {"approved_count"}


# -- tools/call ------------------------------------------------------------------------------


def test_a_result_comes_back_as_structured_content_and_the_same_json_as_text(
    stdio: StdioServer,
) -> None:
    async def body(session: ClientSession) -> list[types.CallToolResult]:
        return [
            await session.call_tool("search", {"query": "red-headed league", "limit": 1}),
            await session.call_tool("word_count", {"text": "one two three"}),
        ]

    search, words = stdio.run(body)

    assert not search.is_error
    # A list is not an object, so it is wrapped; a dict result is used as it is.
    assert search.structured_content is not None
    assert search.structured_content["result"][0]["source"] == "the-red-headed-league.txt"
    assert json.loads(text(search)) == search.structured_content
    assert words.structured_content == {"words": 3}
    assert json.loads(text(words)) == {"words": 3}
    # Each result names the toolexec call that answered it (for toolexec cancel, the logs).
    ids = [(r.meta or {}).get(CALL_ID_META_KEY) for r in (search, words)]
    assert all(isinstance(i, str) and i for i in ids) and ids[0] != ids[1], ids


def test_invalid_arguments_are_an_error_result_naming_each_field_and_nothing_runs(
    stdio: StdioServer, runs: tuple[str, redis.Redis]
) -> None:
    counter, _ = runs

    async def body(session: ClientSession) -> list[types.CallToolResult]:
        return [
            await session.call_tool("probe_echo", {"text": 1}),
            await session.call_tool("idem_count", {"counter": counter, "seconds": "long"}),
            await session.call_tool("probe_echo", {"text": "ok", "number": 2}),
        ]

    bad, refused, good = stdio.run(body)

    assert bad.is_error
    assert text(bad) == (
        "invalid arguments for tool 'probe_echo': 'number' is a required property; "
        "text: 1 is not of type 'string'"
    )
    assert bad.structured_content == {
        "error": {"type": "ToolArgumentsInvalid", "message": text(bad)}
    }
    assert refused.is_error and "seconds:" in text(refused)
    assert executions(runs) == 0  # refused in the proxy: the worker never saw it
    assert not good.is_error and good.structured_content is not None
    assert good.structured_content["text"] == "ok"  # and the server keeps serving


def test_a_deadline_in_meta_times_the_call_out_as_an_error_result_and_the_server_keeps_serving(
    stdio: StdioServer,
) -> None:
    async def body(
        session: ClientSession,
    ) -> tuple[types.CallToolResult, float, types.CallToolResult]:
        started = time.monotonic()
        slow = await session.call_tool(
            "probe_sleep", {"seconds": 5}, meta=meta({TIMEOUT_META_KEY: 0.5})
        )
        elapsed = time.monotonic() - started
        return slow, elapsed, await session.call_tool("call_context", {})

    slow, elapsed, after = stdio.run(body)

    assert slow.is_error
    assert text(slow) == "tool 'probe_sleep' timed out after 0.5s"
    assert slow.structured_content == {"error": {"type": "ToolTimeoutError", "message": text(slow)}}
    assert 0.5 <= elapsed < 0.5 + DEADLINE_SLACK  # at the deadline, long before the 5 s tool
    assert not after.is_error


def test_the_deadline_is_the_one_in_meta_else_the_tools_own_else_the_settings_default(
    stdio: StdioServer,
) -> None:
    async def body(session: ClientSession) -> list[dict[str, Any]]:
        results = [
            await session.call_tool("call_context", {}, meta=meta({TIMEOUT_META_KEY: 4})),
            await session.call_tool("call_context", {}, meta=meta({TIMEOUT_META_KEY: "none"})),
            await session.call_tool("own_deadline", {}, meta=meta({TIMEOUT_META_KEY: 9})),
            await session.call_tool("own_deadline", {}),
            await session.call_tool("call_context", {}),
        ]
        return [r.structured_content or {} for r in results]

    given, unlimited, over_own, own, default = stdio.run(body)

    assert 3.0 < given["time_left"] <= 4.0
    assert unlimited["time_left"] is None
    assert 8.0 < over_own["time_left"] <= 9.0
    assert 6.0 < own["time_left"] <= 7.0  # own_deadline's @tool(timeout=7)
    assert 59.0 < default["time_left"] <= 60.0  # TOOLEXEC_DEFAULT_TIMEOUT's default


def test_tool_failures_unknown_tools_and_bad_meta_are_error_results_that_say_what_went_wrong(
    stdio: StdioServer,
) -> None:
    async def body(session: ClientSession) -> list[types.CallToolResult]:
        return [
            await session.call_tool("probe_fail", {"message": "boom"}),
            await session.call_tool("no_such_tool", {}),
            await session.call_tool("call_context", {}, meta=meta({TIMEOUT_META_KEY: "soon"})),
            await session.call_tool("call_context", {}, meta=meta({RUN_ID_META_KEY: 7})),
            await session.call_tool("call_context", {}),
        ]

    failed, unknown, bad_timeout, bad_run, fine = stdio.run(body)

    assert failed.is_error and text(failed) == "tool 'probe_fail' failed: ProbeFailure: boom"
    assert unknown.is_error and text(unknown).startswith("tool 'no_such_tool' is not available:")
    assert "search" in text(unknown)  # it lists the tools that exist
    assert bad_timeout.is_error
    assert text(bad_timeout) == (
        "_meta['toolexec/timeout'] must be a positive number of seconds, or 'none' for no "
        "deadline; got 'soon'"
    )
    assert (
        bad_run.is_error
        and text(bad_run) == "_meta['toolexec/run_id'] must be a non-empty string; got 7"
    )
    assert [
        r.structured_content["error"]["type"] for r in (failed, unknown) if r.structured_content
    ] == [
        "ToolExecutionError",
        "ToolNotFound",
    ]
    assert not fine.is_error


# -- runs -------------------------------------------------------------------------------------


def test_idempotent_repeats_share_one_execution_within_a_session_and_not_across_sessions(
    stdio: StdioServer, runs: tuple[str, redis.Redis]
) -> None:
    counter, _ = runs

    async def twice(session: ClientSession) -> list[dict[str, Any]]:
        first = await session.call_tool("idem_count", {"counter": counter})
        again = await session.call_tool("idem_count", {"counter": counter})
        return [first.structured_content or {}, again.structured_content or {}]

    first, again = stdio.run(twice)
    other, _ = stdio.run(twice)

    assert first["runs"] == 1 and again["token"] == first["token"]
    assert other["runs"] == 2 and other["run_id"] != first["run_id"]
    assert executions(runs) == 2


def test_a_run_id_in_meta_is_the_toolexec_run_even_across_sessions(
    stdio: StdioServer, runs: tuple[str, redis.Redis]
) -> None:
    counter, _ = runs
    run_id = f"mcp-run-{counter}"

    async def in_the_run(session: ClientSession) -> dict[str, Any]:
        result = await session.call_tool(
            "idem_count", {"counter": counter}, meta=meta({RUN_ID_META_KEY: run_id})
        )
        return result.structured_content or {}

    first = stdio.run(in_the_run)
    second = stdio.run(in_the_run)

    assert first["run_id"] == run_id
    assert second["token"] == first["token"]
    assert executions(runs) == 1


# -- the tool list follows the workers ------------------------------------------------------------


async def listing_after_notice(
    notices: Notices,
    list_tools: Callable[[], Awaitable[types.ListToolsResult]],
    wanted: Callable[[set[str]], bool],
) -> set[str]:
    """After each notice, list the tools again; the first listing that is ``wanted``."""
    with anyio.fail_after(45):
        while True:
            await notices.next()
            names = {tool.name for tool in (await list_tools()).tools}
            if wanted(names):
                break
    return names


def test_the_tool_list_follows_a_worker_joining_and_leaving_in_both_protocol_eras_and_transports(
    stdio: StdioServer, http_server: HttpServer, worker_factory: WorkerFactory
) -> None:
    handshake, modern, over_http = Notices(), Notices(), Notices()
    extra: list[WorkerProcess] = []
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with (
            stdio.session(handshake) as session,
            http_session(http_server.url, over_http) as http,
            Client(stdio.params, cache=None) as client,
            client.listen(tools_list_changed=True) as subscription,
            anyio.create_task_group() as tasks,
        ):
            tasks.start_soon(modern.follow, subscription)
            for listed in (session.list_tools, http.list_tools, client.list_tools):
                assert EXTRA_TOOL not in {tool.name for tool in (await listed()).tools}

            extra.append(
                worker_factory(queues=("mcp_extra",), env={"TOOLEXEC_TOOL_MODULES": EXTRA_MODULES})
            )
            joined = [
                await listing_after_notice(n, listed, lambda names: EXTRA_TOOL in names)
                for n, listed in (
                    (handshake, session.list_tools),
                    (over_http, http.list_tools),
                    (modern, client.list_tools),
                )
            ]
            echoed = await session.call_tool(EXTRA_TOOL, {"text": "hello"})

            extra[0].stop()
            left = [
                await listing_after_notice(n, listed, lambda names: EXTRA_TOOL not in names)
                for n, listed in (
                    (handshake, session.list_tools),
                    (over_http, http.list_tools),
                    (modern, client.list_tools),
                )
            ]
            tasks.cancel_scope.cancel()
            seen.update(joined=joined, left=left, echoed=echoed, era=client.protocol_version)

    anyio.run(main)

    assert all(EXTRA_TOOL in names for names in seen["joined"])
    assert seen["echoed"].structured_content == {"result": "hello"}
    assert all(EXTRA_TOOL not in names and "search" in names for names in seen["left"])
    assert seen["era"] in MODERN_PROTOCOL_VERSIONS
    assert min(handshake.count, modern.count, over_http.count) >= 2


# -- HTTP -------------------------------------------------------------------------------------


def test_over_http_it_listens_on_loopback_only_and_gives_each_session_its_own_run(
    http_server: HttpServer, runs: tuple[str, redis.Redis]
) -> None:
    counter, _ = runs

    async def twice() -> list[dict[str, Any]]:
        async with http_session(http_server.url) as session:
            results = [
                await session.call_tool("idem_count", {"counter": counter}) for _ in range(2)
            ]
            return [r.structured_content or {} for r in results]

    first, again = anyio.run(twice)
    other, _ = anyio.run(twice)

    assert tcp_listeners(http_server.port) == {"0100007F"}  # 127.0.0.1, and nothing else
    assert first["runs"] == 1 and again["token"] == first["token"]
    assert other["runs"] == 2 and other["run_id"] != first["run_id"]


def test_a_2026_http_client_has_no_session_so_only_a_run_id_in_meta_joins_its_calls(
    http_server: HttpServer, runs: tuple[str, redis.Redis]
) -> None:
    counter, _ = runs
    in_a_run = meta({RUN_ID_META_KEY: f"run-{counter}"})

    async def main() -> tuple[str, list[dict[str, Any]]]:
        async with Client(http_server.url, cache=None) as client:
            calls = [
                await client.call_tool("idem_count", {"counter": counter}),
                await client.call_tool("idem_count", {"counter": counter}),
                await client.call_tool("idem_count", {"counter": counter}, meta=in_a_run),
                await client.call_tool("idem_count", {"counter": counter}, meta=in_a_run),
            ]
            return client.protocol_version, [c.structured_content or {} for c in calls]

    era, (first, second, joined, again) = anyio.run(main)

    assert era in MODERN_PROTOCOL_VERSIONS
    assert [first["runs"], second["runs"], joined["runs"]] == [1, 2, 3]
    assert again["token"] == joined["token"] and joined["run_id"] == f"run-{counter}"


def test_over_http_concurrent_timeouts_and_failures_are_error_results_and_leave_no_thread_behind(
    http_server: HttpServer,
) -> None:
    async def calls() -> tuple[list[types.CallToolResult], int]:
        results: list[types.CallToolResult] = []
        async with http_session(http_server.url) as session:

            async def call(
                name: str, arguments: dict[str, Any], options: types.RequestParamsMeta | None
            ) -> None:
                results.append(await session.call_tool(name, arguments, meta=options))

            # This server's first call starts its reply listener.
            await call("call_context", {}, None)
            before = http_server.threads()
            async with anyio.create_task_group() as tasks:
                for _ in range(3):
                    tasks.start_soon(
                        call, "probe_sleep", {"seconds": 3}, meta({TIMEOUT_META_KEY: 0.3})
                    )
                    tasks.start_soon(call, "probe_fail", {"message": "boom"}, None)
            return results[1:], before

    results, before = anyio.run(calls)

    assert (
        sorted(text(r) for r in results)
        == ["tool 'probe_fail' failed: ProbeFailure: boom"] * 3
        + ["tool 'probe_sleep' timed out after 0.3s"] * 3
    )
    assert all(r.is_error for r in results)
    assert wait_until(lambda: http_server.threads() <= before, timeout=5), http_server.threads()


# -- the example ---------------------------------------------------------------------------------


def test_the_example_prints_what_its_docstring_says(
    framework_env: dict[str, str], framework_worker: WorkerProcess
) -> None:
    assert_example_prints_its_docstring("mcp_client.py", framework_env, timeout=90)


# -- approval: a tool that requires it is asked for through elicitation --------------------


def _answering(action: str, asked: list[str]) -> Any:
    """An elicitation callback that records each question and answers ``action``."""

    async def answer(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action=action)  # type: ignore[arg-type]

    return answer


def _runs(framework_env: dict[str, str], counter: str) -> int:
    with redis.Redis.from_url(framework_env["TOOLEXEC_REDIS_URL"]) as store:
        return int(store.get(counter) or 0)


@pytest.mark.parametrize("action", ["accept", "decline", "cancel"])
def test_a_handshake_host_is_asked_to_approve_each_call_and_only_an_accepted_one_runs(
    stdio: StdioServer, framework_env: dict[str, str], action: str
) -> None:
    counter = f"approval:{action}:{time.monotonic_ns()}"
    asked: list[str] = []

    async def main() -> types.CallToolResult:
        async with (
            stdio_client(stdio.params, errlog=stdio.errlog) as (read, write),
            ClientSession(read, write, elicitation_callback=_answering(action, asked)) as session,
        ):
            await session.initialize()
            return await session.call_tool("approved_count", {"counter": counter})

    result = anyio.run(main)

    assert len(asked) == 1 and "approved_count" in asked[0] and counter in asked[0]
    if action == "accept":
        assert not result.is_error and result.structured_content == {"runs": 1}
        assert _runs(framework_env, counter) == 1
    else:
        assert result.is_error
        assert f"the user {action}d the approval" in text(
            result
        ) or f"the user {action}led" in text(result)
        assert "it was not run" in text(result)
        assert _runs(framework_env, counter) == 0  # never reached a worker


@pytest.mark.parametrize("action", ["accept", "decline"])
def test_a_2026_host_answers_the_approval_in_its_retry_and_only_an_accepted_call_runs(
    http_server: HttpServer, framework_env: dict[str, str], action: str
) -> None:
    counter = f"approval26:{action}:{time.monotonic_ns()}"
    asked: list[str] = []

    async def main() -> types.CallToolResult:
        async with Client(
            http_server.url, elicitation_callback=_answering(action, asked)
        ) as client:
            assert client.session.protocol_version in MODERN_PROTOCOL_VERSIONS
            return await client.call_tool("approved_count", {"counter": counter})

    result = anyio.run(main)

    assert len(asked) == 1 and "approved_count" in asked[0]
    if action == "accept":
        assert not result.is_error and result.structured_content == {"runs": 1}
        assert _runs(framework_env, counter) == 1
    else:
        assert result.is_error and "declined the approval" in text(result)
        assert _runs(framework_env, counter) == 0


def test_a_host_that_cannot_be_asked_is_refused_and_nothing_runs(
    stdio: StdioServer, http_server: HttpServer, framework_env: dict[str, str]
) -> None:
    counter = f"approval-none:{time.monotonic_ns()}"

    async def main() -> list[types.CallToolResult]:
        async with Client(http_server.url) as client:  # 2026-07-28, no elicitation callback
            modern = await client.call_tool("approved_count", {"counter": counter})
        async with stdio.session() as session:  # handshake era, no elicitation callback
            handshake = await session.call_tool("approved_count", {"counter": counter})
        return [modern, handshake]

    for result in anyio.run(main):
        assert result.is_error
        assert "requires approval, and this MCP client cannot be asked for it" in text(result)
        assert "--approve-all" in text(result)
    assert _runs(framework_env, counter) == 0


def test_with_approve_all_the_operator_approves_every_call_and_nobody_is_asked(
    framework_env: dict[str, str], framework_worker: WorkerProcess, tmp_path: Path
) -> None:
    counter = f"approval-all:{time.monotonic_ns()}"
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "toolexec", "mcp", "--approve-all"],
        env=framework_env,
        cwd=ROOT,
    )

    async def main(errlog: TextIO) -> tuple[types.CallToolResult, list[types.Tool]]:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            listed = (await session.list_tools()).tools
            return await session.call_tool("approved_count", {"counter": counter}), listed

    with open(tmp_path / "approve-all.log", "w") as errlog:
        result, listed = anyio.run(main, errlog)

    assert not result.is_error and result.structured_content == {"runs": 1}
    approved = next(t for t in listed if t.name == "approved_count")
    assert approved.annotations is not None and approved.annotations.read_only_hint is False
