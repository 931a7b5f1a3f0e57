"""``run_scope()``: the agent run that idempotent calls are deduplicated within.

Inside a scope, repeats of an idempotent call with the same arguments share one
execution. Outside any scope every call is its own run, so nothing is deduplicated.
"""

from __future__ import annotations

import uuid
from contextvars import ContextVar, Token
from types import TracebackType

__all__ = ["current_run_id", "run_scope"]

_run_id: ContextVar[str | None] = ContextVar("toolexec_run_id", default=None)


def current_run_id() -> str | None:
    """The run id of the innermost :class:`run_scope`, or None outside any."""
    return _run_id.get()


class run_scope:
    """Set the run id for the calls made inside; usable with ``with`` and ``async with``.

    Args:
        run_id: The run's id, e.g. your framework's; a fresh one when omitted.

    Example:
        with run_scope() as run_id:
            book(flight_id="BA117", passenger="Ada")  # runs
            book(flight_id="BA117", passenger="Ada")  # same run, same arguments: joined
    """

    def __init__(self, run_id: str | None = None) -> None:
        if run_id is not None and (not isinstance(run_id, str) or not run_id):
            raise ValueError(f"run_id must be a non-empty string, got {run_id!r}")
        self.run_id = run_id or uuid.uuid4().hex
        self._tokens: list[Token[str | None]] = []

    def __enter__(self) -> str:
        self._tokens.append(_run_id.set(self.run_id))
        return self.run_id

    def __exit__(self, *exc: object) -> None:
        _run_id.reset(self._tokens.pop())

    async def __aenter__(self) -> str:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__()
