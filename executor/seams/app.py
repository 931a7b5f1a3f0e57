"""The Celery app that workers run: ``celery -A executor worker``.

Building it imports the tool modules (``TOOLEXEC_TOOL_MODULES``) so the registry is
full before the worker forks, configures JSON-only messaging, sets the pool a worker
runs when its command line names none (``TOOLEXEC_WORKER_POOL``: Celery's
``worker_pool``), sends task events only when wanted (``TOOLEXEC_TASK_EVENTS``:
:mod:`executor.seams.events`), and names toolexec's seams: the transport, the consumer,
the tasks with their request and backend, and the lockdown and task-events bootsteps.

Importing this module connects the worker's signal handlers: the catalog heartbeat at
the worker's start and stop (:class:`executor.worker.Heartbeat`), the Prometheus
metrics' hooks (:mod:`executor.metrics`), the JSON log format
(:func:`executor.tracing.apply_log_format`), and the last flush of a prefork child's
call counts as it exits (:func:`executor.stats.flush_now`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Celery, signals
from celery.utils.imports import import_from_cwd
from celery.worker import state as worker_state
from kombu.entity import Queue

from executor import cancel_state, metrics, runlog, stats
from executor.keeper import Keeper
from executor.pools import WORKER_POOLS
from executor.registry import registered_tools
from executor.seams import put_back
from executor.seams.celery_tasks import register_tasks
from executor.seams.events import TaskEvents, sends_task_events_at_start
from executor.seams.lockdown import Lockdown, broker_ssl_options
from executor.seams.loop_reads import LoopReads
from executor.seams.transport import (
    BROKER_URL_OPTION,
    MAX_ITEM_OPTION,
    REDIS_URL_OPTION,
    SENTINEL_MASTER_OPTION,
    in_hand,
)
from executor.tracing import apply_log_format, use_log_format
from executor.worker import Heartbeat, holder, mark_main_process, redis_client, worker_id
from wire import keys
from wire.connect import kombu_url, sentinel_group
from wire.errors import ConfigurationError
from wire.message import CELERY_LIMIT_MARGIN
from wire.settings import Settings
from wire.urls import is_amqp_url

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
    if longest and longest + CELERY_LIMIT_MARGIN >= settings.visibility_timeout:
        raise ConfigurationError(
            f"TOOLEXEC_VISIBILITY_TIMEOUT ({settings.visibility_timeout}s) must exceed the longest "
            f"hard_timeout ({longest:g}s) plus Celery's {CELERY_LIMIT_MARGIN:g}s margin, or Redis "
            "redelivers calls that are still running"
        )
    queues = sorted({t.spec.queue for t in tools.values()} | {"default"})
    app = Celery("toolexec", set_as_current=False)
    sentinels = sentinel_group(settings.broker_url, settings.sentinel_master)
    app.conf.update(
        # kombu reads a sentinel:// URL's TLS from broker_use_ssl, not from the URL, and
        # each Sentinel's credentials from its own part (wire.connect.kombu_url).
        broker_url=kombu_url(settings.broker_url) if sentinels else settings.broker_url,
        # rediss:// without ssl_* parameters: verify the server, as redis-py does.
        broker_use_ssl=broker_ssl_options(settings.broker_url)
        if sentinels is None
        else sentinels.tls,
        broker_connection_retry_on_startup=True,
        # Kombu's ack emulation keeps each message in Redis until it is acknowledged and
        # restores it after the visibility timeout. toolexec notices a lost worker
        # itself, within seconds (heartbeats and holders), so it is off unless asked for.
        # Redis only: an AMQP broker (RabbitMQ) acknowledges and redelivers by itself.
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout,
            "ack_emulation": settings.ack_emulation,
            # executor.seams.transport: where refused items are dead-lettered, and the largest
            # item read from a queue (a call's arguments, base64-encoded, with room).
            REDIS_URL_OPTION: settings.redis_url,
            BROKER_URL_OPTION: settings.broker_url,
            SENTINEL_MASTER_OPTION: settings.sentinel_master,
            # kombu's Sentinel channel: the group whose master is the broker, and TLS to
            # its Sentinels as to the master.
            **(
                {"master_name": sentinels.master, "sentinel_kwargs": sentinels.sentinel_options()}
                if sentinels is not None
                else {}
            ),
            MAX_ITEM_OPTION: 2 * settings.max_argument_bytes + 65_536,
            # Calls carry no priority (the client pushes every message onto the queue's own
            # list): one BRPOP key per queue instead of kombu's four priority lists.
            "priority_steps": [0],
        }
        if not is_amqp_url(settings.broker_url)
        else {},
        # kombu's Redis transport and Celery's consumer, refusing what they cannot read
        # (dead-lettered, executor.seams.deadletter) instead of stopping the worker.
        broker_transport=_guarded_transport(settings.broker_url),
        worker_consumer="executor.seams.consumer:Consumer",
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
        # Task events only where wanted (TOOLEXEC_TASK_EVENTS, executor.seams.events):
        # off at the start unless `on`; Flower turns them on with `enable_events`.
        worker_send_task_events=sends_task_events_at_start(settings),
    )
    if settings.worker_pool is not None:
        # The pool a worker runs when its command line names none (TOOLEXEC_WORKER_POOL).
        app.conf.worker_pool = WORKER_POOLS[settings.worker_pool]
    app.toolexec_settings = settings
    use_log_format(settings.log_format)  # applied once Celery sets up its loggers
    register_tasks(app, settings)
    # At worker start: JSON only, toolexec's tasks only, credentials that work.
    app.steps["worker"].add(Lockdown)
    # TOOLEXEC_TASK_EVENTS=off wins over -E.
    app.steps["worker"].add(TaskEvents)
    # The asyncio pool's loop reads the task queues itself (TOOLEXEC_LOOP_READS).
    app.steps["consumer"].add(LoopReads)
    return app


def _guarded_transport(broker_url: str) -> str | None:
    """toolexec's Redis transport for a ``redis://`` or ``rediss://`` broker, its Sentinel
    transport for a ``sentinel://`` one, else the URL's."""
    scheme = broker_url.partition("://")[0].lower()
    if scheme == "sentinel":
        return "executor.seams.transport:SentinelTransport"
    return "executor.seams.transport:Transport" if scheme in ("redis", "rediss") else None


def get_app() -> Celery:
    """The process's worker app, built on first use from the environment."""
    global _app
    with _lock:
        if _app is None:
            _app = create_app()
        return _app


# -- the worker's signals ---------------------------------------------------------------

# The metrics' hooks come first: Celery calls a signal's receivers in the order they
# connected, so at worker_ready /metrics is served before the heartbeat's first beat.
signals.worker_init.connect(metrics.on_worker_init, weak=False)
signals.worker_ready.connect(metrics.on_worker_ready, weak=False)
signals.worker_process_shutdown.connect(metrics.on_process_shutdown, weak=False)
signals.worker_shutdown.connect(metrics.on_worker_shutdown, weak=False)
# The JSON log format, applied once Celery sets up its loggers; pool processes inherit it.
signals.after_setup_logger.connect(apply_log_format, weak=False)
signals.after_setup_task_logger.connect(apply_log_format, weak=False)


@signals.worker_process_shutdown.connect
def _on_process_shutdown(**_: Any) -> None:
    # A prefork child that exits (retired after a runaway tool, or stopped with its
    # worker) sends the call counts it still holds; one that counted nothing sends nothing.
    # So with its run log's events.
    stats.flush_now()
    runlog.flush_now()


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
    runlog.set_pool(pool)  # the run log names it beside each call this process runs
    hostname = sender.hostname
    heartbeat = Heartbeat(
        client,
        worker_id=worker_id(sender.hostname),
        hostname=sender.hostname,
        queues=queues,
        specs=[d.spec for d in tools.values()],
        interval=settings.heartbeat_interval,
        pool=pool,
        flush_counts=stats.flush_into,
        running=lambda: _calls_held(hostname),
        concurrency=int(getattr(sender.pool, "limit", 0) or 0),
        ignoring_cancel=cancel_state.ran_on,
        # Where tools run in this process, a process of its own keeps the worker visible
        # while a tool holds the interpreter's lock (executor.keeper).
        keeper=None
        if pool == "prefork"
        else Keeper(
            worker_key=keys.worker(worker_id(hostname)), interval=settings.heartbeat_interval
        ),
    )
    put_back.LEDGER.holder_prefix = f"{worker_id(hostname)}|"
    heartbeat.start()
    _heartbeats.append(heartbeat)
    _check_pool_often(sender)


def _calls_held(hostname: str) -> list[tuple[str, str]]:
    """(``running:<call id>``, holder) of every call this worker has taken.

    The holder names the pool process running it, or pid 0 while it waits in this
    worker for a free process, or, popped from its queue, for its turn to be handed to
    Celery (:func:`executor.seams.transport.in_hand`). A client whose call waits
    reads it to notice that this worker died, including calls it had taken but not
    started.
    """
    try:
        held = {
            *worker_state.reserved_requests,
            *worker_state.active_requests,
            *put_back.LEDGER.still_leaving(),
        }
    except RuntimeError:  # a set changed while we copied it; next beat
        return []
    marks = {}
    for request in held:
        kwargs = getattr(request, "kwargs", None)
        call_id = kwargs.get("call_id") if isinstance(kwargs, dict) else None
        if isinstance(call_id, str):
            marks[call_id] = holder(hostname, getattr(request, "worker_pid", None) or 0)
    for call_id in in_hand():
        marks.setdefault(call_id, holder(hostname, 0))
    return [(keys.running(call_id), tag) for call_id, tag in marks.items()]


def _pool_name(pool: Any) -> str:
    # The name `celery worker -P` takes: prefork, solo, threads, eventlet, gevent; and
    # toolexec's asyncio pool (executor.pools.asyncio_pool, through `-P custom`).
    if pool is None:
        return ""
    module = type(pool).__module__.rsplit(".", 1)[-1]
    return {"thread": "threads", "asyncio_pool": "asyncio"}.get(module, module)


def _check_pool_often(consumer: Any) -> None:
    hub = getattr(consumer, "hub", None)
    maintain = getattr(getattr(consumer.pool, "_pool", None), "maintain_pool", None)
    if hub is not None and callable(maintain):
        hub.call_repeatedly(_POOL_CHECK_INTERVAL, maintain)


#: How this worker was told to stop, in turn: "Warm" (SIGTERM) or "Cold" (SIGQUIT, or a
#: second SIGTERM), as Celery's ``worker_shutting_down`` says.
_stopping: list[str] = []


@signals.worker_shutting_down.connect
def _on_worker_shutting_down(how: str | None = None, **_: Any) -> None:
    _stopping.append(how or "")
    # Celery forgets the calls taken but not started as its consumer closes, though the
    # worker holds them until they are put back as its connection closes: the heartbeat
    # goes on naming them (executor.seams.put_back.Ledger.leaving).
    try:
        waiting = [
            r for r in worker_state.reserved_requests if r not in worker_state.active_requests
        ]
    except RuntimeError:  # a set changed while we copied it
        waiting = list(worker_state.reserved_requests)
    put_back.LEDGER.leaving(waiting)


@signals.worker_shutdown.connect
def _on_worker_shutdown(**_: Any) -> None:
    # A warm stop ends here, once the calls it ran have finished and those it had
    # taken but not started are back on their queues: the worker leaves nothing behind,
    # and says so (wire.keys.left). A cold stop cut calls off: its departure is a death.
    warm = bool(_stopping) and _stopping[-1] == "Warm"
    runlog.flush_now()  # the run log's last events of the calls this process delivered
    while _heartbeats:
        _heartbeats.pop().stop(warm=warm)
