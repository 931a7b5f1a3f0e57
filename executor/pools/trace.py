"""Run an async task body on the asyncio pool's loop as Celery's trace would run it.

Celery's trace function (:func:`celery.app.trace.build_tracer`) is synchronous, so the
asyncio pool (:mod:`executor.pools.asyncio_pool`) does not call it for a task with an
async body (:class:`AsyncTask`, toolexec's tasks). :class:`AsyncTrace` reproduces, on
the loop, what a toolexec call needs of it, once the pool has accepted the request:

1. take the call's arguments, update the request dict (args, kwargs, hostname), build
   the task's request :class:`~celery.app.task.Context`, send ``task_prerun``. Celery's
   request has decoded the body in the worker's main process already and put its args
   and kwargs in the request dict (``Request.__init__``), which Celery's trace decodes
   again from the message body; this trace takes them from the request dict, and decodes
   the body only when they are not there. The embed (callbacks, errbacks, chain, chord)
   is then not read: this trace runs none of them (below), and toolexec's request
   refuses a call that carries any. The context is Celery's own class, filled as its
   constructor does (``update``, then the custom headers), with the set of Celery's own
   keys computed once instead of for every request;
2. await ``task.run_async(request, offload, *args, **kwargs)``;
3. send ``task_postrun`` (and ``task_success``), and return what the request's
   ``callback`` takes: ``(0, repr(retval), runtime)``. If the body raised, Celery's own
   :class:`celery.app.trace.TraceInfo` handles the exception as the trace would
   (backend ``mark_as_failure``, ``task_failure``, Reject, Ignore, Retry), in an I/O
   thread, and the result is ``(1, ExceptionInfo, runtime)``.

What Celery's trace does and this does not: push the task's thread-local request stack
(one thread serves every coroutine, so ``task.request`` is meaningless here: the body
gets its request as an argument), store a result or send links and chains (toolexec
calls have neither), deduplicate redeliveries through the result backend (toolexec's
idempotency does that), and enforce Celery's time limits (the body enforces its own,
e.g. toolexec's ``hard_timeout`` cancels the tool coroutine).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Sequence
from typing import Any, Protocol

from billiard.einfo import ExceptionInfo
from celery import signals, states
from celery.app.task import Context
from celery.app.trace import TraceInfo
from celery.exceptions import Ignore, Reject, Retry
from celery.utils.saferepr import saferepr
from kombu.serialization import loads as loads_message

from executor.pools.offload import Offload

__all__ = ["AsyncTask", "AsyncTrace", "TraceResult", "request_context"]

#: A job's result as Celery's request expects it: (failed, repr or ExceptionInfo, runtime).
TraceResult = tuple[int, Any, float]


class AsyncTask(Protocol):
    """A Celery task the asyncio pool runs as a coroutine: it has an async body, ``run_async``.

    ``run_async(request, offload, *args, **kwargs)`` receives the task's request context
    (``task.request`` is not set on this pool) and :class:`~executor.pools.offload.Offload`,
    which runs blocking steps in the pool's I/O threads. Every other task runs Celery's
    own trace in a thread.
    """

    name: str
    resultrepr_maxsize: int

    def run_async(
        self, request: Context, offload: Offload, /, *args: Any, **kwargs: Any
    ) -> Awaitable[Any]: ...


class AsyncTrace:
    """Celery's trace of one request, for an async task body, on the running loop.

    Args:
        hostname: The worker's node name, which the trace puts in each request.
        accept: The content types the app accepts (``prepare_accept_content``).
        offload: The pool's I/O threads: a failure is handled there (it may reach Redis).
    """

    def __init__(self, *, hostname: str, accept: set[str] | None, offload: Offload) -> None:
        self._hostname = hostname
        self._accept = accept
        self._offload = offload

    async def __call__(self, task: AsyncTask, args: tuple[Any, ...]) -> TraceResult:
        """Trace ``task`` for the request in the pool's ``args`` (Celery's ``apply_async``)."""
        _name, task_id, request, body, content_type, content_encoding = args[:6]
        started = time.monotonic()
        context: Context | None = None
        try:
            call_args, call_kwargs, embed = self._arguments(
                request, body, content_type, content_encoding
            )
            request.update(
                {
                    "args": call_args,
                    "kwargs": call_kwargs,
                    "hostname": self._hostname,
                    "is_eager": False,
                },
                **(embed or {}),
            )
            context = request_context(request, call_args, call_kwargs)
            retval = await self._run_body(task, task_id, context, call_args, call_kwargs)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - reported like Celery's trace; a loop must not die
            failure = exc if isinstance(exc, Exception) else _Escaped(exc)
            if context is None:
                context = Context(request, args=(), called_directly=False, kwargs={})
            einfo = await self._offload(functools.partial(_trace_failure, task, context, failure))
            return (1, einfo, time.monotonic() - started)
        runtime = time.monotonic() - started
        if signals.task_success.receivers:
            signals.task_success.send(sender=task, result=retval, runtime=runtime)
        # Celery's trace reports the return value's repr (for the task-succeeded event).
        shown = "None" if retval is None else saferepr(retval, task.resultrepr_maxsize)
        return (0, shown, runtime)

    async def _run_body(
        self,
        task: AsyncTask,
        task_id: str,
        context: Context,
        args: Sequence[Any],
        kwargs: dict[str, Any],
    ) -> Any:
        if signals.task_prerun.receivers:
            signals.task_prerun.send(
                sender=task, task_id=task_id, task=task, args=args, kwargs=kwargs
            )
        state, retval = states.FAILURE, None
        try:
            retval = await task.run_async(context, self._offload, *args, **kwargs)
            state = states.SUCCESS
            return retval
        finally:
            if signals.task_postrun.receivers:
                signals.task_postrun.send(
                    sender=task,
                    task_id=task_id,
                    task=task,
                    args=args,
                    kwargs=kwargs,
                    retval=retval,
                    state=state,
                )

    def _arguments(
        self,
        request: dict[str, Any],
        body: Any,
        content_type: str | None,
        content_encoding: str | None,
    ) -> Any:
        """``(args, kwargs, embed)``: decoded by Celery's request already, or from ``body``."""
        args, kwargs = request.get("args"), request.get("kwargs")
        if isinstance(args, list | tuple) and isinstance(kwargs, dict):
            return args, kwargs, None
        if not content_type:
            return body
        return loads_message(body, content_type, content_encoding, accept=self._accept)  # type: ignore[no-untyped-call]


#: What Celery's ``Context`` does not count as a custom header (``_get_custom_headers``):
#: its own attributes and a few protocol fields.
_CELERY_KEYS = frozenset(
    {*Context.__dict__.keys(), "lang", "task", "argsrepr", "kwargsrepr", "compression"}
)


def request_context(
    request: dict[str, Any], args: Sequence[Any], kwargs: dict[str, Any]
) -> Context:
    """``Context(request, args=args, called_directly=False, kwargs=kwargs)``, built cheaper.

    Celery's constructor updates the context, then, if the request has no ``headers``,
    sets them to the request's keys that are not Celery's own (None if there are none),
    popping every one of Celery's keys from a copy; this does the same in one pass.
    """
    context: Context = Context.__new__(Context)
    context.update(request, args=args, called_directly=False, kwargs=kwargs)
    if context.headers is None:
        custom = {key: value for key, value in request.items() if key not in _CELERY_KEYS}
        context.headers = custom or None
    return context


class _Escaped(Exception):
    """A BaseException (SystemExit, KeyboardInterrupt) a task body raised on the loop."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(f"the task body raised {type(exc).__name__}: {exc}")


def _trace_failure(task: AsyncTask, request: Context, exc: Exception) -> ExceptionInfo:
    """What Celery's trace does with an exception of the task body, for the request's callback.

    Runs in an I/O thread: the result backend's ``mark_as_failure`` may reach Redis.
    """
    try:
        raise exc
    except Reject:
        einfo = ExceptionInfo(internal=True)
        TraceInfo(states.REJECTED, exc).handle_reject(task, request)
        return einfo
    except Ignore:
        einfo = ExceptionInfo(internal=True)
        TraceInfo(states.IGNORED, exc).handle_ignore(task, request)
        return einfo
    except Retry:
        retried: ExceptionInfo = TraceInfo(states.RETRY, exc).handle_error_state(
            task, request, eager=False, call_errbacks=False
        )
        return retried
    except Exception:  # noqa: BLE001 - Celery's trace handles every exception this way
        failed: ExceptionInfo = TraceInfo(states.FAILURE, exc).handle_error_state(
            task, request, eager=False
        )
        return failed
