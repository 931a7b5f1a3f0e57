"""The tasks extension's requests: ``tasks/get``, ``tasks/update``, ``tasks/cancel``, and
``notifications/tasks`` on a ``subscriptions/listen`` stream.

Each request must declare the extension (else ``-32021``; in a handshake-era session,
``-32601``: the extension is not defined there) and name a task this server can find
(:meth:`~toolexec.mcp.tasks.TaskStore.find`; else ``-32602``).

* ``tasks/get``: the task as it is now (a ``DetailedTask``: with its ``result`` once
  ``completed``), after one bounded read of where its call is;
* ``tasks/update``: acknowledged; no toolexec task ever asks for input
  (``input_required``), so there is never a response to take;
* ``tasks/cancel``: the call is cancelled (``CallHandle.cancel``): a queued one never
  starts, a running one is stopped; the task then reads ``cancelled``, unless it ended
  first. Acknowledged at once, as the spec says.

``tasks/result`` and ``tasks/list`` (the 2025-11-25 experimental tasks) are not
served: ``-32601``, as the extension requires.

A ``subscriptions/listen`` request whose ``notifications`` name ``taskIds`` gets, on its
stream, ``notifications/tasks`` (the whole task, as ``tasks/get`` would return it) for
each of those tasks the server found: once after the acknowledgement (which lists
them), then at each change. Any other listen request is served by mcp's own handler.
"""

from __future__ import annotations

import logging
from typing import Any, Literal, cast

import anyio
import anyio.streams.memory
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.subscriptions import SUBSCRIPTION_ID_META_KEY, ListenHandler, SubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ServerEvent, event_matches, event_to_notification

from agent_client import BrokerUnavailable
from toolexec.mcp.meta import Context
from toolexec.mcp.tasks import Task, TaskStore, require_tasks

__all__ = ["TaskRequests"]

logger = logging.getLogger(__name__)

#: Notifications one task stream may hold unsent before it is ended (the client re-listens).
_MAX_BUFFERED = 1024


class TaskIdParams(types.RequestParams):
    """The params of ``tasks/get`` and ``tasks/cancel``."""

    task_id: str


class UpdateTaskParams(TaskIdParams):
    """The params of ``tasks/update``."""

    input_responses: dict[str, Any] | None = None


class TaskNotification(types.Notification[dict[str, Any], Literal["notifications/tasks"]]):
    """``notifications/tasks``: a task's whole state, as ``tasks/get`` returns it."""

    method: Literal["notifications/tasks"] = "notifications/tasks"
    params: dict[str, Any]


_ACK: dict[str, Any] = {"resultType": "complete"}


class TaskRequests:
    """Serves the extension's requests over one :class:`TaskStore`.

    Args:
        store: The tasks.
        bus: The server's subscription bus (its tool list changes).
    """

    def __init__(self, store: TaskStore, bus: SubscriptionBus) -> None:
        self._store = store
        self._bus = bus
        self._listen = ListenHandler(bus)
        self._streams: set[
            anyio.streams.memory.MemoryObjectSendStream[types.Notification[Any, Any]]
        ] = set()

    def register(self, server: Server[None]) -> None:
        """Serve ``tasks/get``, ``tasks/update``, ``tasks/cancel`` and ``subscriptions/listen``."""
        server.add_request_handler("tasks/get", TaskIdParams, self.get)
        server.add_request_handler("tasks/update", UpdateTaskParams, self.update)
        server.add_request_handler("tasks/cancel", TaskIdParams, self.cancel)
        server.add_request_handler(
            "subscriptions/listen", types.SubscriptionsListenRequestParams, self.listen
        )

    async def get(self, ctx: Context, params: TaskIdParams) -> dict[str, Any]:
        """``tasks/get``: the task now."""
        require_tasks(ctx, "tasks/get")
        task = await self._store.find(params.task_id)
        await self._store.refresh(task)
        return {**_ACK, **task.wire()}

    async def update(self, ctx: Context, params: UpdateTaskParams) -> dict[str, Any]:
        """``tasks/update``: acknowledged; no response is ever outstanding, so none is taken."""
        require_tasks(ctx, "tasks/update")
        await self._store.find(params.task_id)
        return dict(_ACK)

    async def cancel(self, ctx: Context, params: TaskIdParams) -> dict[str, Any]:
        """``tasks/cancel``: cancel the call, and acknowledge."""
        require_tasks(ctx, "tasks/cancel")
        task = await self._store.find(params.task_id)
        if not task.ended:
            try:
                await task.handle.cancel_async()
            except BrokerUnavailable as exc:
                raise MCPError(
                    code=types.INTERNAL_ERROR, message=f"Failed to cancel task: {exc}"
                ) from None
        return dict(_ACK)

    async def listen(
        self, ctx: Context, params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        """``subscriptions/listen``: with ``taskIds``, this module's stream; else mcp's."""
        requested = (params.notifications.model_extra or {}).get("taskIds")
        if requested is None:
            return await self._listen(ctx, params)
        require_tasks(ctx, "subscriptions/listen")
        if not isinstance(requested, list) or not all(isinstance(i, str) for i in requested):
            raise MCPError(
                code=types.INVALID_PARAMS,
                message="notifications.taskIds must be a list of task ids",
            )
        tasks: dict[str, Task] = {}
        for task_id in dict.fromkeys(requested):
            try:
                tasks[task_id] = await self._store.find(task_id)
            except MCPError as exc:
                if exc.error.code != types.INVALID_PARAMS:
                    raise
        return await self._serve(ctx, params.notifications, tasks)

    def close(self) -> None:
        """End every open listen stream gracefully."""
        self._listen.close()
        for stream in list(self._streams):
            stream.close()

    async def _serve(
        self, ctx: Context, requested: types.SubscriptionFilter, tasks: dict[str, Task]
    ) -> types.SubscriptionsListenResult:
        subscription_id = ctx.request_id
        if subscription_id is None:
            raise MCPError(
                code=types.INVALID_REQUEST, message="subscriptions/listen requires a request id"
            )
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: subscription_id}
        honored = types.SubscriptionFilter.model_validate(
            {
                "toolsListChanged": requested.tools_list_changed or None,
                "promptsListChanged": requested.prompts_list_changed or None,
                "resourcesListChanged": requested.resources_list_changed or None,
                "resourceSubscriptions": list(requested.resource_subscriptions or ()) or None,
                "taskIds": list(tasks),
            }
        )
        uris = frozenset(honored.resource_subscriptions or ())
        send, receive = anyio.create_memory_object_stream[types.Notification[Any, Any]](
            _MAX_BUFFERED
        )

        def put(note: types.Notification[Any, Any]) -> None:
            try:
                send.send_nowait(note)
            except anyio.ClosedResourceError:
                pass  # the stream is ending
            except anyio.WouldBlock:
                logger.warning("listen stream %r backlog full; ending the stream", subscription_id)
                self._streams.discard(send)
                send.close()

        def on_event(event: ServerEvent) -> None:
            if event_matches(honored, uris, event):
                put(event_to_notification(event, meta))

        def on_task(task: Task) -> None:
            if task.id in tasks:
                put(TaskNotification(params={**task.wire(), "_meta": meta}))

        unsubscribe = self._bus.subscribe(on_event)
        self._streams.add(send)
        try:
            with self._store.listening(on_task):
                await self._notify(
                    ctx,
                    types.SubscriptionsAcknowledgedNotification(
                        params=types.SubscriptionsAcknowledgedNotificationParams(
                            notifications=honored, _meta=meta
                        )
                    ),
                )
                for task in tasks.values():  # where each stands now: it may have ended already
                    on_task(task)
                async for note in receive:
                    await self._notify(ctx, note)
        finally:
            unsubscribe()
            self._streams.discard(send)
            send.close()
            receive.close()
        return types.SubscriptionsListenResult(_meta=meta)

    @staticmethod
    async def _notify(ctx: Context, note: types.Notification[Any, Any]) -> None:
        # send_notification is typed for the core notifications; it sends any model.
        await ctx.session.send_notification(
            cast(types.ServerNotification, note), related_request_id=ctx.request_id
        )
