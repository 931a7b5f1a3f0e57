"""Which calls a block of code sent: ``sent_calls()``, for the id of a plain call.

Every call has an id (``CallHandle.id`` for a submitted one, ``RemoteToolError.call_id``
on every error). A plain call (``invoke``, ``run``, a framework's tool call) returns only
its result; to know its id while it runs (for ``toolexec cancel``, the worker's logs, or
``toolexec status``), send it inside ``sent_calls()``::

    with sent_calls() as sent:
        task = asyncio.ensure_future(search.invoke({"query": "tides"}))
        ...                       # sent[0].call_id is there as soon as the call is sent
        hits = await task

Each call is recorded when it is prepared, in the caller's own context (a task started
inside the block records into it too), in the order they were sent; a call sent again
under a new id (after it joined a call that expired unrun) is recorded again.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["SentCall", "record_sent", "sent_calls"]


@dataclass(frozen=True, slots=True)
class SentCall:
    """One call a ``sent_calls()`` block sent.

    Attributes:
        call_id: The call's id.
        tool: The tool's name.
    """

    call_id: str
    tool: str


_recording: contextvars.ContextVar[list[SentCall] | None] = contextvars.ContextVar(
    "toolexec_sent_calls", default=None
)


@contextlib.contextmanager
def sent_calls() -> Iterator[list[SentCall]]:
    """Record every call sent in this block (this context, and tasks started in it)."""
    sent: list[SentCall] = []
    token = _recording.set(sent)
    try:
        yield sent
    finally:
        _recording.reset(token)


def record_sent(call_id: str, tool: str) -> None:
    """Note a call about to be sent, in the innermost ``sent_calls()`` block, if any."""
    sent = _recording.get()
    if sent is not None:
        sent.append(SentCall(call_id=call_id, tool=tool))
