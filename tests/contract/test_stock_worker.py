"""A stock ``celery worker`` runs the calls the client writes.

The worker is ``celery -A executor worker`` exactly as toolexec launches it; the call
goes through the real client (``configure`` and ``remote_tool``), so the message, the
queue it lands on and the reply are all the production ones.
"""

from __future__ import annotations

from datetime import date

from agent_client import ToolClient, remote_tool
from toolexec import WorkerProcess


def test_a_stock_celery_worker_runs_a_call_the_client_wrote(
    stock_worker: WorkerProcess, agent: ToolClient
) -> None:
    hits = remote_tool("search").run_sync(query="fox")

    assert hits, "search found nothing for 'fox'"
    assert all("fox" in hit["snippet"].lower() for hit in hits)
    assert stock_worker.is_running


def test_a_stock_celery_worker_runs_an_idempotent_call_the_client_claimed_and_wrote(
    stock_worker: WorkerProcess, agent: ToolClient
) -> None:
    before = date.today().isoformat()
    dates = remote_tool("get_today_date").run_sync()
    after = date.today().isoformat()

    assert dates["today"] in (before, after)
    assert dates["tomorrow"] > dates["today"]
    assert stock_worker.is_running
