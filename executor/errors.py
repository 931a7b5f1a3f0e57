"""Errors raised on the worker side.

A tool author meets one of them, at import time:

```
ToolexecError                  (wire.errors)
├── ConfigurationError         a setting has a value toolexec cannot use (wire.errors)
└── ToolDefinitionError        a @tool cannot be registered (raised at import)
```

The others end a delivery inside the worker and never reach a tool author or a caller
as exceptions: Celery sees them, and the worker tells the caller with an outcome.

```
Exception
├── ToolCallFailed             the task of a call whose outcome is an error ends so,
│                              after the outcome is delivered (Celery's events show it)
├── DeliveriesExhausted        the process running an at-least-once call died
│                              TOOLEXEC_MAX_DELIVERIES times; it is given up
├── StoreUnavailable           Redis stayed away while the worker began an idempotent
│                              call; it did not run
├── ReplicasBehind             fewer replicas than TOOLEXEC_REPLICA_ACKS had an idempotent
│                              call's begin in time; it did not run, and is answered as
│                              an expired call (executor.task)
└── celery's InvalidTaskError  a message the worker's main process refuses, dead-lettered
    ├── MalformedCall          not a toolexec call (executor.seams.request)
    └── StartedBefore          a copy RabbitMQ delivered again of a call a process had
                               started (executor.seams.request)
SystemExit
└── ProcessRetired             a prefork child leaves after delivering its outcome,
                               taking a runaway tool thread with it
```

* :class:`ProcessRetired`: a prefork child whose tool overran its ``hard_timeout``
  cannot stop the thread still running the tool. Once the outcome is delivered, the
  task raises this in the child (:func:`executor.limits.retire_if_runaway`); billiard
  (>= 4.3) reports a job's own ``SystemExit`` as its result and then ends the process,
  and the pool starts a fresh one. The task's request (:mod:`executor.seams.request`)
  recognises it, acknowledges the message and reports nothing more: the caller already
  has its outcome.
* :class:`DeliveriesExhausted`: the worker's main process gives up an at-least-once
  call whose process died ``TOOLEXEC_MAX_DELIVERIES`` times, instead of letting
  Celery requeue it again; the reply backend (:mod:`executor.seams.backend`) turns it
  into a ``WorkerLost`` outcome naming the attempts, as it does :class:`StoreUnavailable`.
* :class:`ToolCallFailed`: its message is the error's type and kind only, never the
  tool's message; the task declares it expected (``throws``), so Celery logs it at
  INFO, without a traceback, and the reply backend sends no second outcome for it.

``MalformedCall`` and ``StartedBefore`` must subclass Celery's ``InvalidTaskError`` (the
consumer's ``on_invalid_task`` hook receives them), so they live beside the request
that raises them. Failures of a call never cross the wire as exceptions: a worker turns
them into an :class:`~wire.models.ErrorInfo`.
"""

from __future__ import annotations

from wire.errors import ToolexecError
from wire.models import CallOutcome, CallRequest

#: The public error; the ones that end a delivery are the worker's own, imported by name.
__all__ = ["ToolDefinitionError"]


class ToolDefinitionError(ToolexecError, TypeError):
    """A tool cannot be registered as written; the message says what to change."""


class ToolCallFailed(Exception):
    """How a task whose call failed ends, after its outcome reached the caller.

    The message is ``<error type> (<error kind>)``, e.g. ``ValueError (execution)``.
    """

    def __init__(self, description: str) -> None:
        super().__init__(description)

    @classmethod
    def of(cls, outcome: CallOutcome) -> ToolCallFailed | None:
        """The exception for ``outcome``, or None when it is a success."""
        error = outcome.error
        return None if error is None else cls(f"{error.type} ({error.kind.value})")


class DeliveriesExhausted(Exception):
    """The worker process died on every delivery of an at-least-once call; it is given up."""

    def __init__(self, attempts: int) -> None:
        super().__init__(
            f"the worker process died {attempts} times running this call; it was given up"
        )
        self.attempts = attempts


class StoreUnavailable(Exception):
    """Redis stayed unreachable while a worker tried to begin an idempotent call; it did not run."""

    def __init__(self, patience: float, cause: BaseException) -> None:
        super().__init__(
            f"the worker could not reach Redis for {patience:g} s to begin this call "
            f"({type(cause).__name__}); the call did not run"
        )


class ReplicasBehind(Exception):
    """Fewer replicas than ``TOOLEXEC_REPLICA_ACKS`` had a keyed call's begin in time:
    the call did not run, and its state, held by ``holder``, is to be let go."""

    def __init__(self, call: CallRequest, *, acks: int, wanted: int, holder: str, why: str) -> None:
        self.holder = holder
        super().__init__(
            f"the call to {call.tool!r} was not run: Redis had its start on {acks} of the "
            f"{wanted} replicas TOOLEXEC_REPLICA_ACKS asks for when {why}"
        )


class ProcessRetired(SystemExit):
    """A prefork child leaves after delivering its outcome, taking a runaway tool with it."""
