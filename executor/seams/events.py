"""Task events when they are wanted: ``TOOLEXEC_TASK_EVENTS`` on a worker.

Celery's task events (``task-received``, ``task-started``, ``task-succeeded``, ...) are
what Flower and ``celery events`` show of each call. Sending them costs the worker's
main process about a fifth of its CPU per call on the asyncio pool and about half on
prefork (``python -m bench --only 12``), so a worker sends them only when they are
wanted:

* ``auto`` (the default): none at the start (Celery's own default without ``-E``,
  ``worker_send_task_events`` off), until a monitor asks for them with Celery's
  ``enable_events`` control command. Flower broadcasts it every 5 seconds, so its
  workers send task events while it runs, whenever they were started; for ``celery
  events``, run ``celery -A executor control enable_events`` first. ``disable_events``
  turns them off again. ``-E`` on the command line turns them on from the start.
* ``on``: from the start (``worker_send_task_events``, as ``-E``).
* ``off``: never. :class:`TaskEvents` overrides ``-E``, and the worker answers
  ``enable_events`` with an error naming the setting.

``celery inspect`` and the other control commands do not depend on events: they travel
over the broadcast (pidbox) queue, which every worker consumes
(``worker_enable_remote_control``, on). A worker started with both
``--without-heartbeat`` and ``--without-gossip`` and without ``-E`` has no event
dispatcher at all, so nothing turns its task events on; its ``enable_events`` answer
says so. ``toolexec worker`` keeps Celery's worker heartbeat (and with it the dispatcher).

Importing this module replaces Celery's ``enable_events`` in this process's registry of
control commands with :func:`enable_events`, which asks Celery's for every worker whose
settings allow it.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps
from celery.worker import control

from wire.settings import ENVIRONMENT_VARIABLES, Settings

__all__ = ["TaskEvents", "enable_events", "sends_task_events_at_start"]

logger = logging.getLogger(__name__)

_VARIABLE = ENVIRONMENT_VARIABLES["task_events"]
_celery_enable_events = control.Panel.data["enable_events"]


def sends_task_events_at_start(settings: Settings) -> bool:
    """Celery's ``worker_send_task_events`` for ``settings``: True only for ``on``."""
    return settings.task_events == "on"


class TaskEvents(bootsteps.Step):  # type: ignore[misc]
    """Worker bootstep: with ``TOOLEXEC_TASK_EVENTS=off``, no task events even with ``-E``.

    Celery reads the worker's ``task_events`` (``-E``, else ``worker_send_task_events``)
    when its consumer is created, after every worker step's ``__init__``.
    """

    label = "toolexec task events"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        settings: Settings | None = getattr(parent.app, "toolexec_settings", None)
        if settings is None or settings.task_events != "off" or not parent.task_events:
            return
        logger.warning(
            "%s=off: this worker sends no task events, although -E asks for them", _VARIABLE
        )
        parent.task_events = False


@control.control_command(name="enable_events")  # type: ignore[untyped-decorator]
def enable_events(state: Any) -> dict[str, str]:
    """Tell worker(s) to send task-related events (not where TOOLEXEC_TASK_EVENTS=off)."""
    settings: Settings | None = getattr(state.app, "toolexec_settings", None)
    if settings is not None and settings.task_events == "off":
        reply: dict[str, str] = control.nok(f"task events are off on this worker ({_VARIABLE}=off)")
        return reply
    dispatcher = getattr(state.consumer, "event_dispatcher", None)
    if dispatcher is not None and not dispatcher.enabled:
        reply = control.nok(
            "this worker has no event dispatcher (started with --without-heartbeat and "
            "--without-gossip, without -E): start it without --without-heartbeat"
        )
        return reply
    answer: dict[str, str] = _celery_enable_events(state)
    return answer
