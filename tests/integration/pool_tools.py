"""Test tools on the ``single`` queue for the guarantees every pool keeps (``test_pools.py``).

Workers import this module through ``TOOLEXEC_TOOL_MODULES`` (the test process never
does). It serves, on the queue of the one concurrency-1 worker each pool runs, tools
that other test modules serve on their own queues: an idempotent counting tool
(``idem_tools.py``) and tools that call ``sys.exit`` (``fault_tools.py``). Importing
those modules registers their tools too, on queues this worker does not consume.
"""

from __future__ import annotations

from executor import tool
from tests.integration import fault_tools, idem_tools

#: The queue of test_pools.py's worker.
QUEUE = "single"

tool(name="idem_count_single", queue=QUEUE, idempotent=True)(idem_tools.idem_count)
tool(name="fault_exit_single", queue=QUEUE)(fault_tools.fault_exit)
tool(name="fault_exit_idempotent_single", queue=QUEUE, idempotent=True)(
    fault_tools.fault_exit_idempotent
)
