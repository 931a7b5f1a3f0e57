"""The peers of scenario 11: Dramatiq, arq and taskiq on the benchmark's private Redis.

Each ``*_app`` module is one peer set up as its documentation shows: the no-op its
worker runs, the command line of that worker (a process the harness starts and stops
by PID, as it does raw Celery's) and the client the benchmark calls it with, which
waits for each result. ``calls`` is how any side's calls are made (one at a time, or
N in flight), ``launch`` starts the three peers and hands the scenario a
:class:`~bench.peers.calls.Side` for each, ``usage`` reads what a block of calls cost
each process and Redis, and ``tables`` turns the readings into the scenario's tables
and the issue's goals.

Nothing is imported here: a peer's worker imports its own module only, and importing
Dramatiq loads gevent (its check for gevent's monkey-patching), which the benchmark's
process may do only once scenario 11 runs (tests/integration/test_bench_smoke.py).
"""

from __future__ import annotations

__all__: list[str] = []
