"""The data that crosses the wire between workers and agent clients.

Pure data: what a worker publishes about a tool (:class:`ToolSpec`), what a client
sends to run one (:class:`CallRequest`, the keyword arguments of the Celery task), and
what comes back (:class:`CallOutcome`). Everything crosses the wire as JSON; failures
travel as data (:class:`ErrorInfo`: a kind, the remote type name and its message),
never as pickled exceptions.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict

__all__ = [
    "TASK_AT_LEAST_ONCE",
    "TASK_AT_MOST_ONCE",
    "CallOutcome",
    "MAX_KEY_LENGTH",
    "MAX_RETRY_PAUSE",
    "MAX_TIMEOUT",
    "CallRequest",
    "Deadline",
    "Delivery",
    "ErrorInfo",
    "ErrorKind",
    "Key",
    "ToolSpec",
    "WorkerInfo",
    "retry_pause_bound",
    "should_store",
    "task_name_for",
]

#: The Celery task that runs a tool and acknowledges the message before running it.
TASK_AT_MOST_ONCE = "toolexec.run_tool"
#: The same task, acknowledged after running and requeued if its worker is lost.
TASK_AT_LEAST_ONCE = "toolexec.run_tool_at_least_once"

Delivery = Literal["at_most_once", "at_least_once"]


def task_name_for(delivery: Delivery) -> str:
    """Name of the Celery task that gives ``delivery``."""
    return TASK_AT_LEAST_ONCE if delivery == "at_least_once" else TASK_AT_MOST_ONCE


class _Wire(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class ToolSpec(_Wire):
    """What the catalog says about one tool; all an agent needs to call it."""

    name: str
    description: str
    parameters: dict[str, Any]
    idempotent: bool = False
    queue: str = "default"
    timeout: float | None = None
    hard_timeout: float | None = None
    delivery: Delivery = "at_most_once"
    cache_errors: bool = False
    #: A person approves each call before it runs (each framework adapter asks in its
    #: own way). False for a spec a worker of an older version published.
    requires_approval: bool = False
    #: What the client does when a caller stops waiting (its deadline, its task
    #: cancelled): ``leave`` the call to run on, or ``cancel`` it.
    on_abandon: Literal["leave", "cancel"] = "leave"
    #: Seconds a cancelled call's tool has to unwind before its worker stops waiting for it.
    cancel_grace: float = 1.0
    #: Attempts a worker makes after the first when the tool raises an exception it retries
    #: (``@tool(retries=...)``); 0 for a spec a worker of an older version published.
    retries: int = 0
    #: Seconds of the pause before the first retry; each pause after doubles, up to
    #: :func:`retry_pause_bound`'s cap.
    retry_backoff: float = 0.0

    def longest_run(self) -> float | None:
        """The longest a worker may run one call: every attempt to its hard limit, and the
        longest pause between each two; None without a hard limit (Celery's own limit,
        ``wire.message.CELERY_LIMIT_MARGIN`` above this, reclaims a stuck pool process)."""
        if self.hard_timeout is None:
            return None
        pauses = sum(retry_pause_bound(k, self.retry_backoff) for k in range(1, self.retries + 1))
        return self.hard_timeout * (self.retries + 1) + pauses


#: The longest pause between two attempts of a call, unless the tool's ``retry_backoff``
#: itself is longer.
MAX_RETRY_PAUSE = 600.0


def retry_pause_bound(attempt: int, backoff: float) -> float:
    """The longest pause after failed attempt ``attempt`` (1 for the first) of a tool whose
    ``retry_backoff`` is ``backoff``: ``backoff * 2 ** (attempt - 1)``, capped at
    :data:`MAX_RETRY_PAUSE` (or at ``backoff``, if longer). A worker's pause is jittered
    below it (:mod:`executor.retries`)."""
    return min(backoff * 2.0 ** (attempt - 1), max(MAX_RETRY_PAUSE, backoff))


class WorkerInfo(_Wire):
    """A worker's heartbeat: who it is and which queues and tools it serves."""

    worker_id: str
    hostname: str
    pid: int
    queues: tuple[str, ...]
    tools: tuple[str, ...]
    pool: str = ""
    started_at: float = 0.0
    #: Pool size (``-c``); 0 when unknown.
    concurrency: int = 0
    #: Calls running in the pool at the last beat (taken calls still waiting excluded).
    running: int = 0
    #: When the last beat was written, in epoch seconds on Redis' clock (wire.clock).
    beat_at: float = 0.0
    #: Cancelled calls whose sync tool ignored the cancel and runs on past its grace (a
    #: thread cannot be stopped: the threads, solo and asyncio pools); their callers know.
    ignoring_cancel: int = 0


#: The longest timeout (and hard limit) in seconds: 366 days. Longer ones are refused
#: where they are given, naming this bound; a call that needs no deadline has ``None``.
MAX_TIMEOUT = 366 * 24 * 3600.0

#: The longest run id or idempotency key, in characters.
MAX_KEY_LENGTH = 1024
#: A run id or idempotency key on the wire: a string of 1 to :data:`MAX_KEY_LENGTH` characters.
Key = Annotated[str, Strict(), Field(min_length=1, max_length=MAX_KEY_LENGTH)]

#: A deadline on the wire: a finite number of epoch seconds (not a bool, a string, NaN
#: or infinity, which a raw message could carry and no clock can compare).
Deadline = Annotated[float, Strict(), Field(allow_inf_nan=False)]


class CallRequest(_Wire):
    """One call, as the keyword arguments of the Celery task.

    Attributes:
        call_id: Unique per dispatch; also the Celery task id.
        tool: Registered name of the tool.
        arguments: The arguments, already checked against the schema by the client.
        reply_to: Client id whose reply list receives the outcome.
        deadline: Epoch seconds after which nobody waits; ``None`` for no deadline.
        run_id: The agent run the call belongs to, if any.
        idempotency_key: Set for idempotent tools; the worker stores the outcome under it.
        caller_beats: The caller keeps ``wire.keys.caller(reply_to)`` alive while it
            waits: a worker sheds the call, unrun, once that key is gone.
        handle: A submitted call (``RemoteTool.submit``): its state and outcome are kept
            under ``wire.keys.handle(call_id)``, for any process to attach to.
    """

    call_id: str
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    reply_to: str = ""
    deadline: Deadline | None = None
    run_id: Key | None = None
    idempotency_key: Key | None = None
    caller_beats: bool = False
    handle: bool = False


class ErrorKind(str, enum.Enum):
    """Why a call produced no result."""

    #: The tool raised.
    EXECUTION = "execution"
    #: The arguments do not fit the tool's schema.
    INVALID_ARGUMENTS = "invalid_arguments"
    #: No tool of that name is registered on the worker that got the call.
    NOT_FOUND = "not_found"
    #: The deadline passed before the worker started the call; it never ran.
    EXPIRED = "expired"
    #: The tool ran past its hard time limit and was stopped.
    HARD_TIMEOUT = "hard_timeout"
    #: The worker process running the call died.
    WORKER_LOST = "worker_lost"
    #: The call was cancelled (``CallHandle.cancel()``, ``toolexec cancel``, or its caller
    #: stopped waiting for a tool with ``on_abandon="cancel"``): it never started, or was
    #: stopped.
    CANCELLED = "cancelled"


class ErrorInfo(_Wire):
    """A failure as data: its kind, the remote exception's type name and message."""

    kind: ErrorKind
    type: str
    message: str
    #: How many times the worker ran the tool for this outcome (``@tool(retries=...)``);
    #: 1 for an outcome a worker of an older version sent.
    attempts: int = 1


class CallOutcome(_Wire):
    """What a worker sends back: a JSON result or an error, never both."""

    call_id: str
    ok: bool
    result: Any = None
    error: ErrorInfo | None = None
    #: Worker that produced the outcome (hostname), for diagnostics.
    worker: str = ""

    @classmethod
    def success(cls, call_id: str, result: Any, *, worker: str = "") -> CallOutcome:
        """An outcome carrying ``result``."""
        return cls(call_id=call_id, ok=True, result=result, worker=worker)

    @classmethod
    def failure(
        cls, call_id: str, kind: ErrorKind, type_name: str, message: str, *, worker: str = ""
    ) -> CallOutcome:
        """An outcome carrying an error."""
        error = ErrorInfo(kind=kind, type=type_name, message=message)
        return cls(call_id=call_id, ok=False, error=error, worker=worker)

    def for_call(self, call_id: str) -> CallOutcome:
        """The same outcome addressed to another call (a joiner of an idempotent call)."""
        return self.model_copy(update={"call_id": call_id})


def should_store(spec: ToolSpec | None, outcome: CallOutcome) -> bool:
    """Whether an idempotent call's outcome is kept for repeats of the call.

    Successes always are; execution errors (and hard timeouts) only with
    ``cache_errors``; validation errors, expiries and lost workers never are.
    """
    if outcome.ok:
        return True
    if spec is None or outcome.error is None:
        return False
    return spec.cache_errors and outcome.error.kind in (ErrorKind.EXECUTION, ErrorKind.HARD_TIMEOUT)
