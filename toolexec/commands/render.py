"""Tables for people: ``toolexec tools`` and ``toolexec status`` without ``--json``."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

__all__ = ["status_view", "tools_table"]


def _timeout(row: dict[str, Any]) -> str:
    value = row["timeout"]
    shown = "none" if value is None else f"{value:g}s"
    return shown if row["timeout_from"] == "tool" else f"{shown} (default)"


def tools_table(rows: list[dict[str, Any]]) -> Table:
    """The live catalog (:func:`toolexec.status.tool_rows`) as a table."""
    table = Table(title="tools live workers serve", title_justify="left")
    for column in ("tool", "queue", "idempotent", "timeout", "delivery", "workers"):
        table.add_column(column, no_wrap=True)
    table.add_column("description", no_wrap=True, overflow="ellipsis", min_width=12)
    for row in rows:
        table.add_row(
            row["name"],
            row["queue"],
            "yes" if row["idempotent"] else "no",
            _timeout(row),
            row["delivery"].replace("_", " "),
            "\n".join(row["workers"]),
            row["description"],
        )
    return table


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
            str(row["running"]),
            _age(row["heartbeat_age"]),
            str(len(row["tools"])),
        )
    parts.append(workers if snapshot["workers"] else Text("no live worker", style="bold red"))
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
    return f"{counts['done']} / {counts['failed']} / {counts['timed_out']}"
