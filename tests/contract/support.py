"""Helpers of the contract tests: stock Celery's side of each comparison, and waiting.

The contract tests put what toolexec's client writes next to what ``app.send_task``
writes for the same call; :func:`send_like_the_client` is that ``send_task`` call, in
one place, so every test compares against the same stock message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from celery import Celery

from tests.integration.polling import wait_until
from toolexec import WorkerProcess
from wire.message import CELERY_EXPIRY_GRACE
from wire.models import CallRequest

__all__ = [
    "Check",
    "EventsWorker",
    "differences",
    "kwargsrepr_of",
    "send_like_the_client",
    "wait_until",
]

#: Checks a field that may differ (an id or a time): an explanation if it is wrong, else None.
Check = Callable[[Any, Any], str | None]


class EventsWorker(WorkerProcess):
    """toolexec's worker launcher with task events on (``-E``), as Flower needs them."""

    def argv(self) -> list[str]:
        """The stock command line plus ``-E``."""
        return [*super().argv(), "-E"]


def kwargsrepr_of(tool: str) -> str:
    """The ``kwargsrepr`` both sides write: the tool's name, never its arguments."""
    return f"{{'tool': {tool!r}}}"


def send_like_the_client(
    producer: Celery,
    request: CallRequest,
    *,
    task_name: str,
    queue: str,
    hard_limit: float | None = None,
    headers: Mapping[str, Any] | None = None,
) -> None:
    """Send ``request`` with stock ``send_task``, with the options the client's message carries.

    ``headers`` are more message headers, as ``send_task(headers=...)`` adds them (a
    signed call's ``toolexec_signature``).
    """
    # The client's `expires` is the deadline plus a grace (Celery checks it on the
    # worker's own clock; the task checks the deadline on the shared clock).
    expires = (
        None
        if request.deadline is None
        else datetime.fromtimestamp(request.deadline + CELERY_EXPIRY_GRACE, tz=UTC)
    )
    producer.send_task(
        task_name,
        kwargs=request.model_dump(mode="json"),
        queue=queue,
        task_id=request.call_id,
        expires=expires,
        time_limit=hard_limit,
        soft_time_limit=None,
        ignore_result=True,
        argsrepr="()",
        kwargsrepr=kwargsrepr_of(request.tool),
        shadow=request.tool,  # the client names each call after its tool (Flower, logs)
        headers=dict(headers) if headers else None,
    )


def differences(client: Any, stock: Any, allowed: Mapping[str, Check], path: str = "") -> list[str]:
    """Every way ``client`` differs from ``stock``, field by field; empty if they match.

    Dicts must have the same set of keys at every level; lists the same length; other
    values must be equal and of the same type. A path in ``allowed`` (dotted, e.g.
    ``headers.origin``) is judged by its check instead of by equality.
    """
    where = path or "<envelope>"
    if path in allowed:
        problem = allowed[path](client, stock)
        return [f"{where}: {problem}"] if problem else []
    if isinstance(client, dict) and isinstance(stock, dict):
        found = []
        if client.keys() != stock.keys():
            found.append(
                f"{where}: keys only the client writes {sorted(client.keys() - stock.keys())}, "
                f"keys only send_task writes {sorted(stock.keys() - client.keys())}"
            )
        for key in sorted(client.keys() & stock.keys()):
            found += differences(client[key], stock[key], allowed, f"{path}.{key}" if path else key)
        return found
    if isinstance(client, list) and isinstance(stock, list):
        if len(client) != len(stock):
            return [f"{where}: client {client!r} != send_task {stock!r}"]
        found = []
        for index, (mine, theirs) in enumerate(zip(client, stock, strict=True)):
            found += differences(mine, theirs, allowed, f"{path}[{index}]")
        return found
    if type(client) is not type(stock) or client != stock:
        return [f"{where}: client {client!r} != send_task {stock!r}"]
    return []
