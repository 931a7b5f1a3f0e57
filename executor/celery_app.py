"""The Celery app that workers run: ``celery -A executor worker``.

Building it imports the tool modules (``TOOLEXEC_TOOL_MODULES``) so the registry is
full before the worker forks, configures JSON-only messaging, and wires the catalog
heartbeat to the worker's start and stop.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Celery, signals
from celery.utils.imports import import_from_cwd
from celery.worker import state as worker_state
from kombu.entity import Queue

from executor import keys
from executor.backend import ReplyBackend
from executor.catalog import Heartbeat
from executor.errors import ConfigurationError
from executor.identity import mark_main_process, worker_id
from executor.registry import registered_tools
from executor.reply import redis_client
from executor.settings import Settings
from executor.task import register_tasks

__all__ = ["create_app", "get_app", "import_tool_modules"]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_app: Celery | None = None


def import_tool_modules(settings: Settings) -> None:
    """Import every module named in ``settings.tool_modules``.

    Like Celery's own ``imports``, a module is found on ``sys.path`` or relative to the
    directory the worker was started in.
    """
    for module in settings.tool_modules:
        try:
            import_from_cwd(module)
        except ImportError as exc:
            raise ConfigurationError(
                f"TOOLEXEC_TOOL_MODULES names {module!r}, which cannot be imported: {exc}"
            ) from exc


def create_app(settings: Settings | None = None) -> Celery:
    """Build the worker's Celery app from ``settings`` (default: the environment)."""
    settings = settings or Settings.from_env()
    import_tool_modules(settings)
    tools = registered_tools()
    longest = max((t.spec.hard_timeout or 0 for t in tools.values()), default=0)
    if longest >= settings.visibility_timeout:
        raise ConfigurationError(
            f"TOOLEXEC_VISIBILITY_TIMEOUT ({settings.visibility_timeout}s) must exceed the longest "
            f"hard_timeout ({longest:g}s), or Redis redelivers calls that are still running"
        )
    queues = sorted({t.spec.queue for t in tools.values()} | {"default"})
    app = Celery("toolexec", set_as_current=False)
    app.conf.update(
        broker_url=settings.broker_url,
        broker_connection_retry_on_startup=True,
        # Kombu's ack emulation keeps each message in Redis until it is acknowledged and
        # restores it after the visibility timeout. toolexec notices a lost worker
        # itself, within seconds (heartbeats and holders), so it is off unless asked for.
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout,
            "ack_emulation": settings.ack_emulation,
        },
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_ignore_result=True,
        result_expires=settings.reply_ttl,
        task_default_queue="default",
        task_queues=[Queue(name, routing_key=name) for name in queues],
        worker_prefetch_multiplier=1,
        # toolexec sets no rate limits: skip Celery's per-message bucket bookkeeping.
        worker_disable_rate_limits=True,
        worker_hijack_root_logger=False,
    )
    app.toolexec_settings = settings
    register_tasks(app, settings, ReplyBackend(app=app, settings=settings))
    return app


def get_app() -> Celery:
    """The process's worker app, built on first use from the environment."""
    global _app
    with _lock:
        if _app is None:
            _app = create_app()
        return _app


_heartbeats: list[Heartbeat] = []

#: How often the main process looks for pool children that died. Celery's prefork pool
#: notices an exit from the child's sentinel pipe, but when the pipe closes before the
#: kernel has made the child reapable, that check finds nothing and the exit waits
#: for the pool's own 5-second timer: a lost call would be reported seconds late.
_POOL_CHECK_INTERVAL = 0.25


@signals.celeryd_init.connect
def _on_worker_init(**_: Any) -> None:
    mark_main_process()


@signals.worker_ready.connect
def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    app = sender.app
    settings: Settings | None = getattr(app, "toolexec_settings", None)
    if settings is None:  # a worker of some other app in this process
        return
    client = redis_client(settings)
    tools = registered_tools()
    queues = [q.name for q in sender.task_consumer.queues]
    pool = _pool_name(sender.pool)
    hostname = sender.hostname
    heartbeat = Heartbeat(
        client, worker_id=worker_id(sender.hostname), hostname=sender.hostname, queues=queues, definitions=tools.values(),
        interval=settings.heartbeat_interval, pool=pool,
        running=lambda: _calls_held(hostname),
    )
    heartbeat.start()
    _heartbeats.append(heartbeat)
    _check_pool_often(sender)


def _calls_held(hostname: str) -> list[tuple[str, str]]:
    """(``running:<call id>``, holder) of every call this worker has taken.

    The holder names the pool process running it, or pid 0 while it waits in this
    worker for a free process. A client whose call waits reads it to notice that this
    worker died, including calls it had taken but not started.
    """
    try:
        held = {*worker_state.reserved_requests, *worker_state.active_requests}
    except RuntimeError:  # a set changed while we copied it; next beat
        return []
    wid = worker_id(hostname)
    marks = []
    for request in held:
        kwargs = getattr(request, "kwargs", None)
        call_id = kwargs.get("call_id") if isinstance(kwargs, dict) else None
        if isinstance(call_id, str):
            marks.append((keys.running(call_id), f"{wid}|{getattr(request, 'worker_pid', None) or 0}"))
    return marks


def _pool_name(pool: Any) -> str:
    # The name `celery worker -P` takes: prefork, solo, threads, eventlet, gevent.
    if pool is None:
        return ""
    module = type(pool).__module__.rsplit(".", 1)[-1]
    return {"thread": "threads"}.get(module, module)


def _check_pool_often(consumer: Any) -> None:
    hub = getattr(consumer, "hub", None)
    maintain = getattr(getattr(consumer.pool, "_pool", None), "maintain_pool", None)
    if hub is not None and callable(maintain):
        hub.call_repeatedly(_POOL_CHECK_INTERVAL, maintain)


@signals.worker_shutdown.connect
def _on_worker_shutdown(**_: Any) -> None:
    while _heartbeats:
        _heartbeats.pop().stop()
