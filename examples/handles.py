"""Agent side: hold a call. Submit it and walk away, find it again by its id, cancel one.

Needs a worker serving ``tasks`` (see ``my_tools.py``) and the same ``TOOLEXEC_*``
settings. Prints::

    sender exited: 0
    attached: slow_report 0.2
    status: done
    ToolCancelled: ToolCancelled
"""

from __future__ import annotations

import subprocess
import sys

from agent_client import ToolCancelled, attach, remote_tool

#: A process that submits a call and exits at once: submit() returns once the call is
#: durably queued (its record and message confirmed), so nothing is lost.
SENDER = (
    "from agent_client import remote_tool; "
    "print(remote_tool('slow_report').submit({'seconds': 0.2}).id)"
)


def main() -> None:
    sender = subprocess.run(
        [sys.executable, "-c", SENDER], capture_output=True, text=True, check=True
    )
    print("sender exited:", sender.returncode)
    handle = attach(sender.stdout.strip())  # any process can, also after the sender left
    print("attached:", handle.tool, handle.result_sync(timeout=30)["slept"])
    print("status:", handle.status())

    report = remote_tool("slow_report")
    long_one = report.submit({"seconds": 30}, timeout=60)
    long_one.cancel()  # a queued call never starts; a running one is stopped
    try:
        long_one.result_sync(timeout=10)
    except ToolCancelled as exc:
        print("ToolCancelled:", type(exc).__name__)


if __name__ == "__main__":
    main()
