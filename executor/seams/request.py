"""The task's Celery request and strategy: refuse malformed calls, bound redelivery.

Celery builds a request for every task message in the worker's main process. This one

* refuses, as Celery's ``InvalidTaskError`` (:class:`MalformedCall`), a message that
  is not a toolexec call: a body that is not ``[[], {call fields}, embed]``, fields
  that do not fit :class:`~wire.models.CallRequest`, an embed with callbacks, errbacks,
  a chain or a chord, an ETA, a task id, shadow name or time limit of the wrong
  type. The worker's consumer (:mod:`executor.seams.consumer`) dead-letters it; nothing
  runs;
* when a prefork child dies mid-call (``WorkerLostError``, or billiard >= 4.3
  reporting the job's own ``SystemExit``), lets go of what the dead child held (its
  idempotency key's state, or a plain call's heartbeat record) before Celery requeues
  the message (at-least-once) or reports the loss (at-most-once), so the redelivery,
  or a retry, is not left waiting for a call that nobody runs;
* counts, for an at-least-once call, the deaths of the processes running it
  (:func:`wire.keys.deliveries`); at ``TOOLEXEC_MAX_DELIVERIES`` it stops Celery's
  requeueing: the call is dead-lettered, acknowledged, and reported as
  :class:`~executor.errors.DeliveriesExhausted`, which the reply backend delivers as
  ``WorkerLost`` naming the attempts to the caller and every waiter;
* on RabbitMQ, records who holds an at-most-once call before acknowledging it, and
  refuses a copy RabbitMQ delivered again of one a process had already started
  (:class:`StartedBefore`, :mod:`executor.claims`);
* treats :class:`~executor.errors.ProcessRetired` (a child that delivered its outcome
  and left to take a runaway tool thread with it) as the success it was: acknowledged,
  nothing more reported, never requeued;
* numbers each delivery it receives, should its message go back on its queue before
  it starts (:mod:`executor.seams.put_back`).

Celery's default strategy reads a protocol-2 message's decoded body before it builds
the request (``'args' not in message.payload``); a body that decodes to a number raises
``TypeError`` there. :func:`strategy`, set as the task's ``Strategy``, checks the body's
type first and raises :class:`MalformedCall`, which the consumer's ``on_invalid_task``
dead-letters. The request checks the rest.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pydantic
from billiard.einfo import ExceptionInfo
from billiard.exceptions import WorkerLostError
from celery.concurrency.base import BasePool
from celery.exceptions import InvalidTaskError
from celery.utils.time import maybe_iso8601
from celery.worker.request import Request
from celery.worker.strategy import default
from kombu.exceptions import ContentDisallowed, DecodeError

from executor import cancels
from executor.claims import hold, holds_before_ack, release, started_before
from executor.errors import DeliveriesExhausted, ProcessRetired
from executor.registry import get_tool
from executor.seams import put_back
from executor.seams.deadletter import Refusal, describe, refuse_message
from executor.worker import holder, redis_client
from wire import keys
from wire.copies import generation_of
from wire.depth import MAX_DEPTH, too_deep
from wire.models import CallRequest
from wire.settings import Settings

__all__ = [
    "GENERATION_KEY",
    "MalformedCall",
    "StartedBefore",
    "call_problem",
    "count_death",
    "release_dead_child",
    "request_class",
    "strategy",
]

logger = logging.getLogger(__name__)

#: Failures after which the pool child that ran the call is gone.
_CHILD_GONE = (WorkerLostError, SystemExit, KeyboardInterrupt)

#: What protocol 2's third body element may hold: all of it null for a toolexec call.
_EMBED_KEYS = frozenset({"callbacks", "errbacks", "chain", "chord"})

#: Longest task id accepted (a call id is a few dozen characters).
_MAX_ID_LENGTH = 256


class MalformedCall(InvalidTaskError):  # type: ignore[misc]
    """A toolexec task message that is not a toolexec call.

    The message says what is wrong in toolexec's words; it never quotes the payload.
    """


class StartedBefore(InvalidTaskError):  # type: ignore[misc]
    """A copy RabbitMQ delivered again of an at-most-once call a process had started.

    Its worker died before RabbitMQ heard the acknowledgement; the call may have run,
    so it must not run again (dead-lettered as ``worker_lost``, :mod:`executor.claims`).
    """


def request_class(settings: Settings) -> type[Request]:
    """The request class of toolexec's tasks, bound to ``settings``."""

    class ToolRequest(Request):  # type: ignore[misc]
        """Celery's request that refuses malformed calls and bounds redelivery.

        Runs in the worker's main process.
        """

        #: The app's timezone, read once for every request rather than once per message.
        _toolexec_tz: Any = _UNREAD
        #: The pool's job for this call, once handed over (:attr:`_apply_result`).
        toolexec_job: Any = None

        def __init__(self, message: Any, *args: Any, **kwargs: Any) -> None:
            # Celery's constructor takes its ISO 8601 parser as an argument: the standard
            # library's reads the ``expires`` header toolexec writes (datetime.isoformat)
            # many times faster than dateutil's, which Celery uses by default.
            kwargs.setdefault("maybe_iso8601", _iso8601)
            try:
                super().__init__(message, *args, **kwargs)
            except (InvalidTaskError, ContentDisallowed, DecodeError):
                raise  # Celery's consumer has a hook for each
            except Exception as exc:  # noqa: BLE001 - a body or header of the wrong shape
                raise MalformedCall(
                    f"dropped a malformed toolexec message: not a protocol 2 task ({describe(exc)})"
                ) from None
            problem = call_problem(self)
            if problem:
                raise MalformedCall(f"dropped a malformed toolexec message: {problem}")
            # Which copy of the delivery this is, should it go back on its queue before
            # it starts (executor.seams.put_back).
            self._request_dict[put_back.COPY_KEY] = put_back.LEDGER.receive(message.delivery_tag)
            put_back.LEDGER.taken(message.delivery_tag, self)
            # A copy sent again (wire.copies) asks before it starts: its generation, or 0
            # for one its broker delivered again by itself.
            self._request_dict[GENERATION_KEY] = _generation(message, self.delivery_info)
            #: Record the holder before the early acknowledgement (executor.claims); the
            #: asyncio pool reads it to accept the call off its event loop.
            self.toolexec_holds_before_ack = holds_before_ack(
                settings, acks_late=self.task.acks_late
            )
            if (
                self.toolexec_holds_before_ack
                and self.delivery_info.get("redelivered")
                and started_before(redis_client(settings), self.kwargs["call_id"])
            ):
                raise StartedBefore(
                    "an at-most-once call delivered again after the worker that started it died"
                )

        @property
        def _apply_result(self) -> Any:
            """Celery's weak reference to the pool's job for this call, once handed over."""
            return self.__dict__.get("_toolexec_apply_result")

        @_apply_result.setter
        def _apply_result(self, result: Any) -> None:
            # Celery's hand-over to the pool sets this as it returns, in the subclass its
            # strategy makes of this class (``create_request_cls``, whose own
            # ``execute_using_pool`` would hide one defined here). Keep the job itself
            # for :meth:`put_back.Ledger.started`: the prefork pool's ``AsynPool.flush`` drops a
            # job it finished writing to a child as the connection breaks, and a put-back
            # then would take a call the child runs for one not started: it would run
            # twice.
            self.__dict__["_toolexec_apply_result"] = result
            self.toolexec_job = result() if callable(result) else None

        def on_accepted(self, pid: int, time_accepted: float) -> None:
            put_back.LEDGER.accepted(
                self.message.delivery_tag
            )  # started: not put back when the connection closes
            if self.toolexec_holds_before_ack:
                tag = holder(self.hostname or "", pid)
                hold(
                    redis_client(settings),
                    self.kwargs["call_id"],
                    tag,
                    interval=settings.heartbeat_interval,
                )
            super().on_accepted(pid, time_accepted)

        def cancel(self, pool: Any, signal: Any = None, emit_retry: bool = True) -> None:
            """Celery's cancel of a running call (a cold stop): on prefork its process is
            ended; on the pools that run calls in the worker's own process (solo, threads,
            asyncio) no one call can be stopped, so it is left to end (the asyncio pool's
            cold stop cancels its coroutines itself), rather than fail the stop with
            Celery's ``NotImplementedError`` from ``terminate_job``."""
            if stops_one_job(pool):
                super().cancel(pool, signal, emit_retry)
                return
            logger.info(
                "cold stop: call %s runs on to its end (the %s pool cannot stop one call)",
                self.kwargs.get("call_id") if isinstance(self.kwargs, dict) else self.id,
                type(pool).__name__,
            )

        @property
        def tzlocal(self) -> Any:
            # Celery's reads the app's configuration on every message (its cache never
            # holds the default, None); the setting does not change while a worker runs.
            tz = ToolRequest._toolexec_tz
            if tz is _UNREAD:
                tz = ToolRequest._toolexec_tz = self._app.conf.timezone
            return tz

        def on_failure(
            self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
        ) -> Any:
            exc = getattr(exc_info, "exception", None)
            exc = getattr(exc, "exc", exc)  # unwrap billiard's ExceptionWithTraceback
            if isinstance(exc, ProcessRetired):
                # The child delivered the outcome, then left (a runaway tool thread):
                # a success for Celery, acknowledged even when late; nothing to report.
                return self.on_success((False, None, 0.0))
            # billiard >= 4.3 reports a job's own SystemExit or KeyboardInterrupt and the
            # child then exits; Celery's on_failure counts that as a lost worker too.
            if isinstance(exc, _CHILD_GONE) and self.worker_pid:
                tag = holder(self.hostname or "", self.worker_pid)
                release_dead_child(self.kwargs, settings=settings, tag=tag)
                if isinstance(self.id, str) and cancels.recorded(self.id, settings):
                    # The child left past a cancel's grace, its caller told: done, never requeued.
                    return self.on_success((False, None, 0.0))
                if self.task.acks_late and self.task.reject_on_worker_lost:
                    exc_info = self._give_up_after_max_deliveries(exc_info)
            return super().on_failure(exc_info, send_failed_event, return_ok)

        def _give_up_after_max_deliveries(self, exc_info: Any) -> Any:
            """``exc_info``, or DeliveriesExhausted once the call's process died too often.

            Celery requeues a lost at-least-once call; a failure that is not a lost
            worker is acknowledged and reported instead (``acks_on_failure_or_timeout``).
            """
            attempts = count_death(self.kwargs, settings=settings)
            if attempts is None or attempts < settings.max_deliveries:
                return exc_info
            call_id = self.kwargs.get("call_id") if isinstance(self.kwargs, dict) else None
            refuse_message(
                self.message,
                Refusal.WORKER_LOST,
                f"the worker process died {attempts} times running this call",
                client=redis_client(settings),
                call_id=call_id if isinstance(call_id, str) else None,
            )
            try:
                raise DeliveriesExhausted(attempts)
            except DeliveriesExhausted:
                return ExceptionInfo()

    return ToolRequest


_UNREAD = object()

#: The field of a task request that holds its copy's generation (:mod:`wire.copies`), or
#: None for a first send, which starts without asking.
GENERATION_KEY = "toolexec_generation"


def stops_one_job(pool: Any) -> bool:
    """Whether Celery's ``pool`` can end one running job (prefork's processes can; a pool
    running jobs in the worker's own process cannot)."""
    return type(pool).terminate_job is not BasePool.terminate_job and not getattr(
        pool, "runs_in_process", False
    )


def _generation(message: Any, delivery_info: Any) -> int | None:
    origin = getattr(message, "toolexec_origin", None)
    if origin is not None:
        generation = generation_of(origin[1])
        if generation is not None:
            return generation
    redelivered = isinstance(delivery_info, dict) and delivery_info.get("redelivered")
    return 0 if redelivered else None


def _iso8601(value: Any) -> Any:
    """Celery's ``maybe_iso8601`` with the standard library's parser first."""
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            pass  # a form only dateutil reads, or no date: Celery's own parser decides
    return maybe_iso8601(value)


def call_problem(request: Any) -> str:
    """What keeps a Celery request from being a toolexec call; "" when nothing does.

    Never quotes the payload: field names and types only.
    """
    if not isinstance(request.id, str) or not 0 < len(request.id) <= _MAX_ID_LENGTH:
        return "its task id is not a string of 1 to 256 characters"
    headers = request.request_dict
    if headers.get("eta") is not None:
        return "it has an ETA; toolexec calls run at once"
    if not _is_timelimit(headers.get("timelimit")):
        return "its timelimit is not two non-negative numbers or nulls"
    shadow = headers.get("shadow")  # the tool's name, for Celery's logs and Flower
    if shadow is not None and not (isinstance(shadow, str) and len(shadow) <= _MAX_ID_LENGTH):
        return "its shadow name is not a string of up to 256 characters"
    body = request.message.payload  # kombu's decoded body, cached
    if not (isinstance(body, list | tuple) and len(body) == 3):
        return "its body is not [args, kwargs, embed]"
    args, fields, embed = body
    if not isinstance(args, list | tuple) or args:
        return "it has positional arguments"
    if embed is not None and not (
        isinstance(embed, dict) and set(embed) <= _EMBED_KEYS and not any(embed.values())
    ):
        return "it carries callbacks, errbacks, a chain or a chord"
    try:
        CallRequest.model_validate(fields)
    except pydantic.ValidationError as exc:
        names = sorted(
            {str(e["loc"][0]) if e["loc"] else "(fields)" for e in exc.errors(include_url=False)}
        )
        return f"{exc.error_count()} problems with its call fields ({', '.join(names)})"
    raw = getattr(
        request.message, "body", None
    )  # the body's JSON: [args, {..., "arguments": {...}}, embed]
    if isinstance(raw, bytes | str) and too_deep(raw, around=3):
        return f"its arguments nest deeper than {MAX_DEPTH} levels of arrays and objects"
    return ""


def _is_timelimit(value: Any) -> bool:
    if value is None:
        return True
    if not (isinstance(value, list | tuple) and len(value) == 2):
        return False
    return all(
        v is None
        or (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0)
        for v in value
    )


def count_death(fields: Any, *, settings: Settings) -> int | None:
    """Count one more death of a process running the call in ``fields``; the new count.

    None when it cannot be counted (malformed fields, Redis unreachable): Celery then
    requeues the call as it would without a limit.
    """
    try:
        call = CallRequest.model_validate(fields)
        definition = get_tool(call.tool)
        ttl_ms = keys.call_ttl_ms(
            "deliveries",
            deadline=call.deadline,
            settings=settings,
            hard_timeout=definition.spec.hard_timeout if definition is not None else None,
        )
        pipe = redis_client(settings).pipeline(transaction=False)
        pipe.incr(keys.deliveries(call.call_id))
        pipe.pexpire(keys.deliveries(call.call_id), ttl_ms)
        count, _ = pipe.execute()
        return int(count)
    except Exception as exc:  # noqa: BLE001 - Celery's own handling must still run
        logger.warning("could not count the deliveries of a lost call: %s", type(exc).__name__)
        return None


def release_dead_child(fields: Any, *, settings: Settings, tag: str) -> bool:
    """Let go of what ``tag`` holds of the call in ``fields``, if anything
    (:func:`executor.claims.release`)."""
    try:
        call = CallRequest.model_validate(fields)
        return release(redis_client(settings), call, holder=tag)
    except Exception as exc:  # noqa: BLE001 - Celery's own handling must still run
        logger.warning("could not release the marker of a lost call: %s", type(exc).__name__)
        return False


def strategy(task: Any, app: Any, consumer: Any, **kwargs: Any) -> Callable[..., Any]:
    """Celery's default strategy for ``task``, refusing a body that is not a list."""
    handle = default(task, app, consumer, **kwargs)

    def task_message_handler(message: Any, body: Any, *args: Any, **options: Any) -> Any:
        if body is None and not isinstance(message.payload, list):  # decoded once, cached
            raise MalformedCall(
                "dropped a malformed toolexec message: its body is not [args, kwargs, embed]"
            )
        return handle(message, body, *args, **options)

    return task_message_handler
