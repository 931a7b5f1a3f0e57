"""toolexec's benchmark suite: ``python -m bench`` (``--smoke`` for CI, ``--help``).

It measures toolexec side by side with plain Celery, a hand-written Redis RPC,
LazyBridge's in-process timeout and its peers (Dramatiq, arq, taskiq), in one run, on
one private Redis server and the same worker pool, and prints one table per scenario
with the issue's goals marked PASS or MISS. Modules:

- ``cli``: the command line and the run order;
- ``harness``: the private server, the workers of every side, the clients;
- ``scenarios/``: one module per scenario, numbered as in the issue;
- ``tools``, ``raw_celery``, ``redis_rpc``: what the workers of each side run;
- ``peers/``: Dramatiq, arq and taskiq, the peers of scenario 11: their workers, their
  clients, and how a side's calls and their costs are made and read;
- ``amqp``, ``amqp_tools``: the run over RabbitMQ (``--broker amqp``);
- ``signing``: ``python -m bench.signing``, the pure cost of message signing;
- ``soak``, ``soak_checks``, ``soak_report``: ``python -m bench soak``, its checks and
  its report;
- ``stats``, ``report``, ``machine``, ``sizes``, ``names``, ``cpu``, ``plots``: helpers.
"""

from __future__ import annotations

# Nothing is imported here: workers import ``bench.tools`` and need none of the rest.
__all__: list[str] = []
