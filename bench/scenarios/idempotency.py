"""5. An idempotent repeat (a cache hit) against a dispatch.

Inside one ``agent_client.run_scope()``, each idempotent no-op is called twice with the
same arguments: the first call dispatches (and claims the idempotency key), the repeat
should be answered from the stored outcome without reaching a worker. Blocks of plain
no-op dispatches alternate with blocks of pairs.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable
from typing import Any

import agent_client
from bench.harness import Bench
from bench.report import Goal, ScenarioResult, Table, count, ms, ratio
from bench.stats import Latencies, alternate, timed

NUMBER = 5
TITLE = "Idempotent repeat (cache hit) against a dispatch"

_TIMEOUT = 10.0
_DISPATCH = "dispatch (noop)"
_FIRST = "idempotent first call (noop_idempotent)"
_REPEAT = "idempotent repeat, same run (cache hit)"


def run(bench: Bench) -> ScenarioResult:
    """Time dispatches, first idempotent calls and their repeats; compare the p50s."""
    run_scope: Callable[[], contextlib.AbstractContextManager[Any]] | None = getattr(
        agent_client, "run_scope", None
    )
    if run_scope is None:
        return ScenarioResult(
            number=NUMBER,
            title=TITLE,
            tables=[
                Table(
                    columns=("side", "p50 ms", "p99 ms"),
                    rows=[("n/a (run_scope not available)", "–", "–")],
                )
            ],
            goals=[
                Goal(
                    name="cache hit p50 / dispatch p50",
                    measured="n/a (run_scope not available)",
                    target="≤ 0.25×",
                    met=None,
                )
            ],
        )
    noop = bench.tool("noop")
    idempotent = bench.tool("noop_idempotent")
    keys = itertools.count()

    def pairs(n: int) -> tuple[list[float], list[float]]:
        firsts, repeats = [], []
        with run_scope():
            for _ in range(n):
                arguments = {"key": next(keys)}
                start = time.perf_counter()
                idempotent.invoke_sync(arguments, timeout=_TIMEOUT)
                middle = time.perf_counter()
                idempotent.invoke_sync(arguments, timeout=_TIMEOUT)
                firsts.append(middle - start)
                repeats.append(time.perf_counter() - middle)
        return firsts, repeats

    def dispatches(n: int) -> list[float]:
        return timed(lambda: noop.invoke_sync({}, timeout=_TIMEOUT), n)

    sizes = bench.sizes
    dispatches(sizes.warmup)
    pairs(sizes.warmup)
    results = alternate(
        [
            (_DISPATCH, lambda: (dispatches(sizes.idempotent_pairs), [])),
            (_FIRST, lambda: pairs(sizes.idempotent_pairs)),
        ],
        sizes.rounds,
    )
    latencies = {
        _DISPATCH: Latencies.of([b[0] for b in results[_DISPATCH]]),
        _FIRST: Latencies.of([b[0] for b in results[_FIRST]]),
        _REPEAT: Latencies.of([b[1] for b in results[_FIRST]]),
    }
    dispatch_p50 = latencies[_DISPATCH].p50
    rows = [
        (name, count(len(lat)), ms(lat.p50), ms(lat.p99), ratio(lat.p50 / dispatch_p50))
        for name, lat in latencies.items()
    ]
    measured = latencies[_REPEAT].p50 / dispatch_p50
    return ScenarioResult(
        number=NUMBER,
        title=TITLE,
        tables=[Table(columns=("call", "calls", "p50 ms", "p99 ms", "p50 vs dispatch"), rows=rows)],
        goals=[
            Goal(
                name="cache hit p50 / dispatch p50",
                measured=ratio(measured),
                target="≤ 0.25×",
                met=measured <= 0.25,
            )
        ],
        notes=[
            (
                f"{sizes.rounds} alternated rounds of {sizes.idempotent_pairs} dispatches or "
                "pairs; one run_scope() per block."
            )
        ],
    )
