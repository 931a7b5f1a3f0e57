"""Tables for people: ``toolexec tools`` and ``toolexec status`` without ``--json``."""

from __future__ import annotations

import io
import time
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

__all__ = ["status_view", "tools_view"]


def _timeout(row: dict[str, Any]) -> str:
    value = row["timeout"]
    shown = "none" if value is None else f"{value:g}s"
    return shown if row["timeout_from"] == "tool" else f"{shown} (default)"


def tools_view(rows: list[dict[str, Any]], width: int) -> RenderableType:
    """The live catalog (:func:`toolexec.status.tool_rows`) for a terminal ``width`` wide.

    A table when every field but the description fits whole on one line and the
    description, which wraps, keeps :data:`DESCRIPTION_MIN_WIDTH` columns; otherwise one
    block per tool, each field in full, so nothing is ever cut to an ellipsis.
    """
    fields = Measurement.get(_MEASURING, _MEASURING.options, _tools_table(rows, description=False))
    if fields.maximum + _DESCRIPTION_BORDER + DESCRIPTION_MIN_WIDTH <= width:
        return _tools_table(rows, description=True)
    return Group(
        Text("tools live workers serve", style="italic"), *(_tool_block(row) for row in rows)
    )


#: The narrowest description column the table is shown with.
DESCRIPTION_MIN_WIDTH = 20
_DESCRIPTION_BORDER = 3  # one rule and a cell's padding on each side
_MEASURING = Console(width=10_000, file=io.StringIO())


def _tools_table(rows: list[dict[str, Any]], *, description: bool) -> Table:
    table = Table(title="tools live workers serve", title_justify="left")
    for column in ("tool", "queue", "idempotent", "timeout", "delivery", "approval", "workers"):
        table.add_column(column, no_wrap=True)
    if description:
        table.add_column("description", overflow="fold", ratio=1)
    for row in rows:
        table.add_row(*_fields(row)[: None if description else -1])
    return table


def _fields(row: dict[str, Any]) -> tuple[str, ...]:
    return (
        row["name"],
        row["queue"],
        "yes" if row["idempotent"] else "no",
        _timeout(row),
        row["delivery"].replace("_", " "),
        "required" if row.get("requires_approval") else "no",
        "\n".join(row["workers"]),
        row["description"],
    )


def _tool_block(row: dict[str, Any]) -> RenderableType:
    name, queue, idempotent, timeout, delivery, approval, _, description = _fields(row)
    lines = [
        (
            f"queue {queue} · idempotent {idempotent} · timeout {timeout} · delivery {delivery} · "
            f"approval {approval}"
        ),
        f"workers {', '.join(row['workers'])}",
    ]
    if description:
        lines.append(description)
    details = (Padding(Text(line), (0, 0, 0, 2)) for line in lines)
    return Group(Text(""), Text(name, style="bold"), *details)


def _age(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds:.1f}s ago"


def status_view(snapshot: dict[str, Any]) -> RenderableType:
    """Everything :func:`toolexec.status.status_snapshot` read, as tables."""
    parts: list[RenderableType] = [
        Text(f"toolexec status at {time.strftime('%H:%M:%S', time.localtime(snapshot['time']))}")
    ]
    workers = Table(title="workers", title_justify="left")
    for column in ("worker", "queues", "pool", "concurrency", "running", "last heartbeat", "tools"):
        workers.add_column(column, overflow="fold")
    for row in snapshot["workers"]:
        workers.add_row(
            row["worker_id"],
            ",".join(row["queues"]),
            row["pool"] or "?",
            str(row["concurrency"] or "?"),
            str(row["running"])
            + (
                f" ({row['ignoring_cancel']} ignoring a cancel)"
                if row.get("ignoring_cancel")
                else ""
            ),
            _age(row["heartbeat_age"]),
            str(len(row["tools"])),
        )
    only = snapshot.get("worker_filter")
    missing = "no live worker" if only is None else f"no live worker named {only!r}"
    parts.append(workers if snapshot["workers"] else Text(missing, style="bold red"))
    queues = Table(title="queues", title_justify="left")
    queues.add_column("queue")
    queues.add_column("waiting", justify="right")
    for name, depth in snapshot["queues"].items():
        queues.add_row(name, str(depth))
    parts.append(queues)
    if "broker_error" in snapshot:
        parts.append(Text(f"queue depths unknown: {snapshot['broker_error']}", style="bold red"))
    calls = Table(title="calls (done / failed / timed out)", title_justify="left")
    calls.add_column("tool")
    calls.add_column("last minute", justify="right")
    calls.add_column("last hour", justify="right")
    minute, hour = snapshot["calls"]["last_minute"], snapshot["calls"]["last_hour"]
    for tool in sorted(set(minute) | set(hour)):
        calls.add_row(tool, _counts(minute.get(tool)), _counts(hour.get(tool)))
    parts.append(calls if (minute or hour) else Text("no calls in the last hour"))
    dead = snapshot["deadletter"]
    reasons = ", ".join(f"{reason}: {count}" for reason, count in dead["by_reason"].items())
    parts.append(Text(f"dead-lettered: {dead['count']}" + (f" ({reasons})" if reasons else "")))
    return Group(*parts)


def _counts(counts: dict[str, Any] | None) -> str:
    if not counts:
        return "-"
    shown = f"{counts['done']} / {counts['failed']} / {counts['timed_out']}"
    retries = counts.get("retries", 0)
    return f"{shown} ({retries} {'retry' if retries == 1 else 'retries'})" if retries else shown
