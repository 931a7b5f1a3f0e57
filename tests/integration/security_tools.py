"""Tools of the security tests, on a queue of their own (``security``).

``record`` leaves a file named after its tag in the data directory, so a test can tell
whether a call ran; ``echo`` returns its text; ``fail`` raises with its text in the
message; ``crash`` ends its process with its text in the ``SystemExit``; ``idem_record``
is ``record`` as an idempotent, at-least-once tool; ``steps`` reports progress.
"""

from __future__ import annotations

from executor import report_progress, tool
from tasks import _settings

__all__ = ["crash", "echo", "fail", "idem_record", "record", "steps"]

QUEUE = "security"


def _mark(tag: str) -> str:
    path = _settings.data_dir() / f"ran-{tag}"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as marks:
        marks.write("ran\n")
    return str(path)


@tool(queue=QUEUE)
def record(tag: str) -> str:
    """Leave a mark named after ``tag`` in the data directory and return its path.

    Args:
        tag: Names the mark.
    """
    return _mark(tag)


@tool(queue=QUEUE, idempotent=True)
def idem_record(tag: str) -> str:
    """Leave a mark named after ``tag``, once per run.

    Args:
        tag: Names the mark.
    """
    return _mark(tag)


@tool(queue=QUEUE)
def echo(text: str) -> dict[str, str]:
    """Return ``text``.

    Args:
        text: What to return.
    """
    return {"echo": text}


@tool(queue=QUEUE)
def fail(text: str) -> None:
    """Raise a ValueError whose message holds ``text``.

    Args:
        text: Goes into the exception's message.
    """
    raise ValueError(f"declined: {text}")


@tool(queue=QUEUE)
def crash(text: str) -> None:
    """End the process running the tool, with ``text`` in the SystemExit.

    Args:
        text: Goes into the SystemExit's message.
    """
    raise SystemExit(f"bye: {text}")


@tool(queue=QUEUE)
def steps(count: int) -> int:
    """Report progress ``count`` times, then return ``count``.

    Args:
        count: How many steps to report.
    """
    for step in range(1, count + 1):
        report_progress(step, count, f"step {step} of {count}")
    return count
