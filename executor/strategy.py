"""The task's Celery strategy: Celery's default, refusing a body that is not a list first.

Celery's default strategy reads a protocol-2 message's decoded body before it builds the
request (``'args' not in message.payload``); a body that decodes to a number raises
``TypeError`` there. This strategy, set as the task's ``Strategy``, checks the body's
type first and raises :class:`~executor.request.MalformedCall` (Celery's
``InvalidTaskError``), which the consumer's ``on_invalid_task`` dead-letters. The
request (:mod:`executor.request`) checks the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery.worker.strategy import default

from executor.request import MalformedCall

__all__ = ["strategy"]


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
