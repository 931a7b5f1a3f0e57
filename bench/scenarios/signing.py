"""10. Signing: what ``TOOLEXEC_SIGNING_KEY`` costs per call.

End to end: sequential no-op round trips through a real worker, unsigned and signed, in
the same run. Each side has a private Redis server and a toolexec worker of its own (the
shared pool and concurrency): a signed worker refuses unsigned calls, so the two cannot
share a queue, and giving both sides a fresh pair keeps them alike. Blocks alternate
(A B A B ...). Then the pure cost, without Redis: signing as the client does it and
verifying as the worker does, for arguments of a few sizes (:mod:`bench.signing`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from agent_client import RemoteTool, ToolClient, remote_tool
from bench import signing
from bench.harness import PROJECT_ROOT, Bench
from bench.report import Goal, ScenarioResult, Table, count, ms
from bench.stats import Latencies, alternate, timed
from toolexec import RedisServer, WorkerProcess
from wire.settings import Settings

NUMBER = 10
TITLE = "Signing: what it costs per call"

_TIMEOUT = 10.0
_UNSIGNED = "unsigned"
_SIGNED = "signed (TOOLEXEC_SIGNING_KEY)"


@contextlib.contextmanager
def _side(bench: Bench, name: str, key: str | None) -> Iterator[RemoteTool]:
    """A private Redis, a worker on it and a client of it; signed when ``key`` is given."""
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(RedisServer(directory=bench.logs.parent / f"redis-{name}"))
        env = {**bench.env, "TOOLEXEC_BROKER_URL": server.url, "TOOLEXEC_REDIS_URL": server.url}
        if key is not None:
            env["TOOLEXEC_SIGNING_KEY"] = key
        worker = WorkerProcess(
            name=f"signing-{name}",
            pool=bench.options.pool,
            concurrency=bench.options.concurrency,
            queues=("default",),
            env=env,
            cwd=PROJECT_ROOT,
            log_dir=bench.logs,
        )
        stack.enter_context(worker)
        client = ToolClient(Settings.from_env(env))
        stack.callback(client.close)
        yield remote_tool("noop", client=client)


def _calls(tool: RemoteTool, n: int) -> list[float]:
    return timed(lambda: tool.invoke_sync({}, timeout=_TIMEOUT), n)


def _block(tool: RemoteTool, n: int) -> Callable[[], list[float]]:
    return lambda: _calls(tool, n)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f}"


def run(bench: Bench) -> ScenarioResult:
    """Alternate unsigned and signed blocks; then time signing and verifying alone."""
    with _side(bench, "unsigned", None) as plain, _side(bench, "signed", signing.KEY) as signed:
        sides = {_UNSIGNED: plain, _SIGNED: signed}
        for tool in sides.values():
            _calls(tool, bench.sizes.warmup)
        n = bench.sizes.roundtrip_calls
        blocks = [(name, _block(tool, n)) for name, tool in sides.items()]
        latencies = {
            name: Latencies.of(runs) for name, runs in alternate(blocks, bench.sizes.rounds).items()
        }
    extra = latencies[_SIGNED].p50 - latencies[_UNSIGNED].p50
    round_trip = Table(
        columns=("side", "calls", "p50 ms", "p99 ms"),
        rows=[(name, count(len(lat)), ms(lat.p50), ms(lat.p99)) for name, lat in latencies.items()],
    )
    calls, repeats = 20 * bench.sizes.roundtrip_calls, bench.sizes.rounds
    pure = {
        label: signing.measure(size, calls=calls, repeats=repeats)
        for label, size in signing.SIZES.items()
    }
    cost = Table(
        columns=("arguments", "client: prepare + sign, extra µs", "sign µs", "worker: verify µs"),
        rows=[
            (label, f"{r['prepare_difference']:.1f}", f"{r['sign']:.1f}", f"{r['verify']:.1f}")
            for label, r in pure.items()
        ],
    )
    return ScenarioResult(
        number=NUMBER,
        title=TITLE,
        tables=[round_trip, cost],
        goals=[
            Goal(
                name="signed p50 − unsigned p50, no-op round trip",
                measured=f"{_us(extra)} µs",
                target="information",
                met=None,
            )
        ],
        notes=[
            (
                f"Round trips: {bench.sizes.rounds} rounds of {n} sequential no-op calls per side, "
                f"A B A B ..., each side on its own private Redis and {bench.options.pool} -c "
                f"{bench.options.concurrency} worker."
            ),
            (
                f"Pure cost: the median of {repeats} runs of {calls} calls, no Redis (python -m "
                "bench.signing)."
            ),
        ],
    )
