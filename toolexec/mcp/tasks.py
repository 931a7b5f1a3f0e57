"""MCP's tasks extension (``io.modelcontextprotocol/tasks``, SEP-2663): a call as a task.

A 2026-07-28 request that declares the extension in its capabilities
(``_meta["io.modelcontextprotocol/clientCapabilities"].extensions``) gets, for
``tools/call``, a task instead of the result: the call is sent with
``RemoteTool.submit_async`` and the response (``resultType: "task"``) names it by its
toolexec call id once the call is durably queued, its record and message confirmed (so
``tasks/get`` finds it from any session of any ``toolexec mcp`` process, also after the
session and the process that created it are gone). A request that does not declare it,
and every handshake-era session (the extension is not defined there), gets the result as
before. A call refused before it is sent (a bad ``_meta``, invalid arguments, a tool no
worker serves), or one that could not be queued by its deadline (Redis unreachable), is
answered with its error result at once, which the spec allows: the server decides, per
request, whether to make a task.

How a call's state reads as a task (:meth:`Task.wire`, what ``tasks/get`` and
``notifications/tasks`` carry):

* queued or running: ``working``, with ``statusMessage`` saying which, and the tool's
  latest progress report (MCP has no progress on tasks: ``notifications/progress`` ends
  with the ``tools/call`` response);
* ended with a result, or with a toolexec error (it failed, timed out, expired unrun,
  its worker died): ``completed``, with ``result`` the very ``CallToolResult`` a plain
  call gets, ``isError: true`` for an error; the spec keeps ``failed`` for JSON-RPC
  errors, which a call never ends with;
* cancelled (``tasks/cancel``, or ``CallHandle.cancel`` in any process): ``cancelled``.

A task lives as long as its call's record (``TOOLEXEC_HANDLE_TTL`` from its last change:
``ttlMs`` counts it from ``createdAt``); this process remembers at most
:data:`MAX_TASKS`, and finds any other one by attaching to its record
(``agent_client.attach``). An unknown id is the spec's ``-32602``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectSendStream
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from agent_client import (
    BrokerUnavailable,
    CallHandle,
    CallNotFound,
    ProgressEvent,
    RemoteTool,
    RemoteToolError,
    ToolCancelled,
    ToolClient,
    attach,
)
from agent_client.catalog import READ_TIMEOUT
from agent_client.deadline import Timeout
from toolexec.mcp.meta import Context

__all__ = [
    "MAX_TASKS",
    "POLL_INTERVAL_MS",
    "TASKS_EXTENSION",
    "Task",
    "TaskStore",
    "declares_tasks",
    "require_tasks",
]

logger = logging.getLogger(__name__)

#: The extension's identifier, in both sides' ``capabilities.extensions``.
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
#: Tasks remembered at most; the least recently changed are forgotten first (they can
#: still be found through their record).
MAX_TASKS = 10_000
#: The polling interval suggested to clients (``pollIntervalMs``).
POLL_INTERVAL_MS = 1000

TaskStatus = Literal["working", "completed", "failed", "cancelled"]


def declares_tasks(ctx: Context) -> bool:
    """Whether the request declares the tasks extension (2026-07-28 requests only)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    return bool(
        capabilities and capabilities.extensions and TASKS_EXTENSION in capabilities.extensions
    )


def require_tasks(ctx: Context, method: str) -> None:
    """Refuse ``method`` (a ``tasks/*`` request) as the spec says, unless the request may send it.

    Raises:
        MCPError: ``-32601`` in a handshake-era session (the extension is not defined
            there); ``-32021`` for a request that does not declare the extension.
    """
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        raise MCPError(code=types.METHOD_NOT_FOUND, message="Method not found", data=method)
    if not declares_tasks(ctx):
        required = types.ClientCapabilities(extensions={TASKS_EXTENSION: {}})
        raise MCPError(
            code=types.MISSING_REQUIRED_CLIENT_CAPABILITY,
            message=f"Missing required client capability: the {TASKS_EXTENSION} extension",
            data=types.MissingRequiredClientCapabilityErrorData(
                required_capabilities=required
            ).model_dump(by_alias=True, mode="json", exclude_none=True),
        )


def _timestamp(epoch: float) -> str:
    moment = datetime.datetime.fromtimestamp(epoch, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Task:
    """One call as an MCP task: its handle, and what ``tasks/get`` says of it."""

    def __init__(self, handle: CallHandle, *, ttl: int) -> None:
        self.handle = handle
        self.id = handle.id
        self.created = self.updated = time.time()
        self.status: TaskStatus = "working"
        self.message = "queued: waiting for a worker"
        self.result: dict[str, Any] | None = None
        self._ttl = ttl
        self._progress: ProgressEvent | None = None

    @property
    def ended(self) -> bool:
        """Whether the task is terminal: completed, failed or cancelled."""
        return self.status != "working"

    def wire(self) -> dict[str, Any]:
        """The task as a ``DetailedTask`` (``tasks/get``, ``notifications/tasks``)."""
        task: dict[str, Any] = {
            "taskId": self.id,
            "status": self.status,
            "statusMessage": self._status_message(),
            "createdAt": _timestamp(self.created),
            "lastUpdatedAt": _timestamp(self.updated),
            # The record lives TOOLEXEC_HANDLE_TTL from its last change; ttlMs counts from creation.
            "ttlMs": int((self.updated - self.created + self._ttl) * 1000),
            "pollIntervalMs": POLL_INTERVAL_MS,
        }
        if self.status == "completed":
            task["result"] = self.result
        return task

    def _status_message(self) -> str:
        event = self._progress
        if self.ended or event is None:
            return self.message
        total = "" if event.total is None else f"/{event.total:g}"
        said = f" {event.message}" if event.message else ""
        return f"{self.message}; progress {event.done:g}{total}{said}"

    def ran(self, status: str) -> bool:
        """Note where the call is (``CallHandle.status``); True if that changed the task."""
        message = {"queued": "queued: waiting for a worker", "running": "running on a worker"}.get(
            status
        )
        if self.ended or message is None or message == self.message:
            return False
        self.message, self.updated = message, time.time()
        return True

    def reported(self, event: ProgressEvent) -> None:
        """Note the tool's latest progress report."""
        if not self.ended:
            self._progress, self.updated = event, time.time()
            self.message = "running on a worker"

    def end(
        self, status: TaskStatus, message: str, result: types.CallToolResult | None = None
    ) -> None:
        """End the task (once: a terminal task never changes)."""
        if self.ended:
            return
        self.status, self.message, self.updated = status, message, time.time()
        if result is not None:
            self.result = result.model_dump(by_alias=True, mode="json", exclude_none=True)


#: Told of every change of a task (on the server's event loop).
TaskListener = Callable[[Task], None]


class TaskStore:
    """The tasks this server process knows, by id, and the watcher that ends each.

    :meth:`run` (in the server's lifespan) runs the watchers: each waits for its call's
    result and ends its task. Listeners (``subscriptions/listen`` streams) hear of every
    change.

    Args:
        client: The client that sends the calls and attaches to others'.
        result_of: The ``CallToolResult`` of a call's value or error, as a plain call gets it.
    """

    def __init__(
        self,
        client: ToolClient,
        result_of: Callable[[Any, BaseException | None], types.CallToolResult],
    ) -> None:
        self.client = client
        self._result_of = result_of
        self._tasks: OrderedDict[str, Task] = OrderedDict()
        self._listeners: dict[object, TaskListener] = {}
        self._send: MemoryObjectSendStream[Task] | None = None

    async def run(self) -> None:
        """Watch every task this process takes on, until cancelled."""
        send, receive = anyio.create_memory_object_stream[Task](max_buffer_size=float("inf"))
        self._send = send
        try:
            async with anyio.create_task_group() as watchers, receive:
                async for task in receive:
                    watchers.start_soon(self._watch, task)
        finally:
            self._send = None

    async def start(
        self,
        remote: RemoteTool,
        arguments: dict[str, Any],
        *,
        timeout: Timeout,
        run_id: str | None,
        started: float,
    ) -> dict[str, Any] | types.CallToolResult:
        """Submit the call and return its ``CreateTaskResult`` once the call is durably
        queued (its record and message confirmed).

        Raises:
            RemoteToolError: The call was refused before it was sent, or was not confirmed
                in time (``BrokerUnavailable``, ``ToolOutcomeUnknown``).
        """
        loop = asyncio.get_running_loop()
        holder: list[Task] = []

        def on_progress(event: ProgressEvent) -> None:  # on the client's progress thread
            try:
                loop.call_soon_threadsafe(self._reported, holder, event)
            except RuntimeError:
                pass  # the server's loop is closed: nobody asks any more

        # Returns once the call's record and message are confirmed (durably queued): the
        # task outlives this session and this process. Not confirmed in time, it raises.
        handle = await remote.submit_async(
            arguments, timeout=timeout, run_id=run_id, started=started, on_progress=on_progress
        )
        task = Task(handle, ttl=self.client.settings.handle_ttl)
        holder.append(task)
        self._remember(task)
        return {"resultType": "task", **task.wire()}

    async def find(self, task_id: str) -> Task:
        """The task ``task_id``: remembered here, or attached to through its record.

        Raises:
            MCPError: ``-32602`` if no such task is kept; ``-32603`` if Redis did not answer.
        """
        task = self._tasks.get(task_id)
        if task is not None and task.updated <= time.time() - self.client.settings.handle_ttl:
            del self._tasks[task_id]  # its record has expired too: ask Redis, which says so
            task = None
        if task is not None:
            self.settle(task)
            return task
        try:
            handle = await anyio.to_thread.run_sync(lambda: attach(task_id, client=self.client))
        except CallNotFound:
            raise MCPError(
                code=types.INVALID_PARAMS,
                message="Failed to retrieve task: Task not found (never created, or expired after "
                "TOOLEXEC_HANDLE_TTL)",
            ) from None
        except BrokerUnavailable as exc:
            raise MCPError(
                code=types.INTERNAL_ERROR, message=f"Failed to retrieve task: {exc}"
            ) from None
        task = self._tasks.get(task_id)  # another request may have attached meanwhile
        if task is None:
            task = Task(handle, ttl=self.client.settings.handle_ttl)
            self._remember(task)
            self.settle(task)  # an ended call's outcome came with the attach
        return task

    def settle(self, task: Task) -> None:
        """End the task if its call has ended in this process (its watcher may not have run yet)."""
        if task.ended or not task.handle.done():
            return
        try:
            value = task.handle.result_sync(timeout=0)
        except ToolCancelled as exc:
            task.end("cancelled", str(exc))
        except RemoteToolError as exc:
            task.end("completed", f"the call failed: {exc}", self._result_of(None, exc))
        except Exception as exc:  # a toolexec bug: answered as a plain call would be
            logger.error("task %s failed inside toolexec: %s", task.id, type(exc).__name__)
            logger.debug("task %s failed inside toolexec", task.id, exc_info=True)
            task.end("completed", "toolexec failed", self._result_of(None, exc))
        else:
            task.end("completed", "the call returned", self._result_of(value, None))
        self._changed(task)

    async def refresh(self, task: Task) -> None:
        """Read where a working task's call is now (one Redis read, bounded); no error."""
        if task.ended:
            return
        with anyio.move_on_after(READ_TIMEOUT):
            try:
                status = await task.handle.status_async()
            except RemoteToolError:
                return
            if task.ran(status):
                self._changed(task)

    @contextmanager
    def listening(self, listener: TaskListener) -> Iterator[None]:
        """Tell ``listener`` of every change of a task while in this block."""
        token = object()
        self._listeners[token] = listener
        try:
            yield
        finally:
            self._listeners.pop(token, None)

    # -- inside -------------------------------------------------------------------------

    def _remember(self, task: Task) -> None:
        self._tasks[task.id] = task
        self._tasks.move_to_end(task.id)
        horizon = time.time() - self.client.settings.handle_ttl
        while self._tasks:
            oldest = next(iter(self._tasks.values()))
            if len(self._tasks) <= MAX_TASKS and oldest.updated > horizon:
                break
            self._tasks.popitem(last=False)
        if self._send is None:
            logger.error(
                "task %s is not watched: the MCP server's lifespan is not running", task.id
            )
            return
        self._send.send_nowait(task)

    async def _watch(self, task: Task) -> None:
        with contextlib.suppress(Exception):  # read again, and answered, by settle()
            await task.handle.result()
        self.settle(task)

    def _reported(self, holder: list[Task], event: ProgressEvent) -> None:
        task = holder[0]
        task.reported(event)
        if task.id in self._tasks:
            self._changed(task)

    def _changed(self, task: Task) -> None:
        if task.id in self._tasks:
            self._tasks.move_to_end(task.id)
        for listener in list(self._listeners.values()):
            try:
                listener(task)
            except Exception:  # one stream's failure must not keep the others uninformed
                logger.warning("a task listener failed", exc_info=True)
