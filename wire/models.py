"""The data that crosses the wire between workers and agent clients.

Pure data: what a worker publishes about a tool (:class:`ToolSpec`), what a client
sends to run one (:class:`CallRequest`, the keyword arguments of the Celery task), and
what comes back (:class:`CallOutcome`). Everything crosses the wire as JSON; failures
travel as data (:class:`ErrorInfo`: a kind, the remote type name and its message),
never as pickled exceptions.
"""

from __future__ import annotations

import enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "TASK_AT_LEAST_ONCE",
    "TASK_AT_MOST_ONCE",
    "CallOutcome",
    "CallRequest",
    "Delivery",
    "ErrorInfo",
    "ErrorKind",
    "ToolSpec",
    "WorkerInfo",
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
    """

    call_id: str
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    reply_to: str = ""
    deadline: float | None = None
    run_id: str | None = None
    idempotency_key: str | None = None


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


class ErrorInfo(_Wire):
    """A failure as data: its kind, the remote exception's type name and message."""

    kind: ErrorKind
    type: str
    message: str


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
