"""Agent side: hold a call. Submit it, find it again by its id, cancel one.

Needs a worker serving ``tasks`` (see ``my_tools.py``) and the same ``TOOLEXEC_*``
settings. Prints::

    submitted: slow_report True
    attached: 0.2
    status: done
    ToolCancelled: ToolCancelled
"""

from __future__ import annotations

from agent_client import ToolCancelled, attach, remote_tool


def main() -> None:
    report = remote_tool("slow_report")
    handle = report.submit({"seconds": 0.2}, timeout=60)  # sent; returns at once
    print("submitted:", handle.tool, handle.status() in ("queued", "running"))
    again = attach(handle.id)  # any process can, also after the sender died
    print("attached:", again.result_sync(timeout=30)["slept"])
    print("status:", handle.status())

    long_one = report.submit({"seconds": 30}, timeout=60)
    long_one.cancel()  # a queued call never starts; a running one is stopped
    try:
        long_one.result_sync(timeout=10)
    except ToolCancelled as exc:
        print("ToolCancelled:", type(exc).__name__)


if __name__ == "__main__":
    main()
