"""Two ways a call leaves its pool process, passed from the pool to the main process.

* :class:`ProcessRetired`: a prefork child whose tool overran its ``hard_timeout``
  cannot stop the thread still running the tool. Once the outcome is delivered, the
  task raises this in the child; billiard (>= 4.3) reports a job's own ``SystemExit``
  as its result and then ends the process, and the pool starts a fresh one. The
  task's request (:mod:`executor.request`) recognises it, acknowledges the message
  and reports nothing more: the caller already has its outcome.
* :class:`DeliveriesExhausted`: the worker's main process gives up an at-least-once
  call whose process died ``TOOLEXEC_MAX_DELIVERIES`` times, instead of letting
  Celery requeue it again; the reply backend (:mod:`executor.backend`) turns it into a
  ``WorkerLost`` outcome naming the attempts.
"""

from __future__ import annotations

from executor.identity import in_pool_child
from executor.runner import runaways

__all__ = ["DeliveriesExhausted", "ProcessRetired", "StoreUnavailable", "retire_if_runaway"]


class ProcessRetired(SystemExit):
    """A prefork child leaves after delivering its outcome, taking a runaway tool with it."""


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


def retire_if_runaway() -> None:
    """In a prefork child with a tool thread still running past its hard limit, leave.

    Call it after the outcome is delivered. On the solo and threads pools the process
    is the worker itself, so it stays, and the thread runs on until the tool returns.

    Raises:
        ProcessRetired: This is a prefork pool child with a runaway tool thread.
    """
    count = runaways()
    if count and in_pool_child():
        raise ProcessRetired(f"leaving: {count} tool thread(s) ran past their hard limit")
