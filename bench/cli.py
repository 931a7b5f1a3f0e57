"""``python -m bench``: run the scenarios and print one table per scenario.

A MISS against a goal is information and leaves the exit status 0; only a scenario
that crashes (or a process that cannot be started) makes it 1.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import get_args

from bench.amqp import AMQP_SCENARIOS, rabbitmq_version
from bench.harness import PROJECT_ROOT, Bench, Options
from bench.machine import describe
from bench.report import ScenarioResult, markdown_table, render
from bench.scenarios import SCENARIOS, Scenario
from bench.sizes import FULL, SMOKE
from toolexec import Pool

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; the exit status (0 unless something crashed)."""
    args = _parser().parse_args(argv)
    selected = _select(args.only, broker=args.broker)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # so that every child is stopped
    options = Options(
        sizes=SMOKE if args.smoke else FULL,
        pool=args.pool,
        concurrency=args.concurrency,
        broker=args.broker,
    )
    command = shlex.join(["python", "-m", "bench", *(sys.argv[1:] if argv is None else argv)])
    when = datetime.datetime.now().astimezone()
    sections = [
        _INTRO.format(command=command, run=options.sizes.name, when=f"{when:%Y-%m-%d %H:%M %Z}")
    ]
    _emit(sections[0])
    crashed = False
    results: list[ScenarioResult] = []
    with Bench.open(options) as bench:
        machine = describe(redis_version=bench.redis_version(), root=PROJECT_ROOT)
        machine.append(
            (
                "shared workers",
                f"{options.pool} pool, concurrency {options.concurrency}, one of each side",
            )
        )
        machine.append(("broker", _broker_line(args.broker)))
        sections.append("## Machine\n\n" + markdown_table(("machine", ""), machine) + "\n")
        _emit(sections[-1])
        for scenario in selected:
            result, ok = _run_one(scenario, bench)
            crashed |= not ok
            results.append(result)
            sections.append(render(result))
            _emit(sections[-1])
    sections.append(_summary(results))
    _emit(sections[-1])
    if args.plot is not None:
        from bench.plots import draw, markdown_images  # matplotlib: the `bench` extra

        drawn = draw(results, args.plot)
        print("drew " + (", ".join(str(path) for _, path in drawn) or "nothing"))
        if args.markdown is not None and drawn:
            sections.append(markdown_images(drawn, args.markdown))
    if args.markdown is not None:
        args.markdown.write_text("\n".join(sections))
        print(f"wrote {args.markdown}")
    return 1 if crashed else 0


_INTRO = """# toolexec benchmarks

toolexec side by side with plain Celery (`send_task().get()`, Redis result backend), a
hand-written Redis RPC and LazyBridge's in-process `Tool(timeout=)`, measured in one
run on one private Redis server, with the same worker pool and concurrency for toolexec
and Celery; scenario 11 adds its peers, Dramatiq, arq and taskiq, on the same server
(their versions are in the machine table, their settings in the scenario). Timed sides
alternate in blocks (A B A B ...) so that drift on a shared machine lands on all of
them. A MISS is information for whoever optimises next.

Command: `{command}` ({run} run, {when})

`python -m bench --smoke` is the short run that CI makes, `--only 1,4` picks scenarios,
`--markdown PATH` writes this page, `--plot DIR` draws its figures there (matplotlib),
`--broker amqp` runs scenarios 1 and 2 over RabbitMQ: its figures are in
[benchmarks-rabbitmq.md](benchmarks-rabbitmq.md)
(`python -m bench --broker amqp --markdown docs/benchmarks-rabbitmq.md`).
"""


def _run_one(scenario: Scenario, bench: Bench) -> tuple[ScenarioResult, bool]:
    start = time.monotonic()
    try:
        result = scenario.run(bench)
        ok = True
    except Exception:  # noqa: BLE001 - reported, and the other scenarios still run
        trace = traceback.format_exc()
        print(trace, file=sys.stderr, flush=True)
        last = trace.strip().splitlines()[-1]
        result = ScenarioResult(
            number=scenario.NUMBER, title=scenario.TITLE, notes=[f"CRASHED: {last}"]
        )
        ok = False
    result.notes.append(f"Took {time.monotonic() - start:.1f} s.")
    return result, ok


def _summary(results: Sequence[ScenarioResult]) -> str:
    rows = [
        (f"{r.number}", g.name, g.measured, g.target, g.verdict) for r in results for g in r.goals
    ]
    return (
        "## Goals\n\n"
        + markdown_table(("scenario", "goal", "measured", "target", "result"), rows)
        + "\n"
    )


def _broker_line(broker: str) -> str:
    if broker == "redis":
        return "the private Redis (calls, replies, results)"
    return (
        f"RabbitMQ {rabbitmq_version()} at 127.0.0.1:5672 for calls and tasks (AMQP, publisher "
        "confirms); the private Redis for replies, results and the RPC floor"
    )


def _select(only: str | None, *, broker: str = "redis") -> list[Scenario]:
    if broker == "amqp":
        over_amqp = ",".join(map(str, AMQP_SCENARIOS))
        asked = {int(part) for part in (only or over_amqp).split(",") if part.strip().isdigit()}
        if asked - set(AMQP_SCENARIOS):
            raise SystemExit(f"--broker amqp runs scenarios {over_amqp} only")
        only = only or over_amqp
    if only is None:
        return list(SCENARIOS)
    try:
        wanted = {int(part) for part in only.split(",") if part.strip()}
    except ValueError:
        raise SystemExit(f"--only takes scenario numbers such as 1,3; got {only!r}") from None
    unknown = wanted - {s.NUMBER for s in SCENARIOS}
    if unknown:
        raise SystemExit(f"--only: no scenario {sorted(unknown)}; there are 1 to {len(SCENARIOS)}")
    return [s for s in SCENARIOS if s.NUMBER in wanted]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke", action="store_true", help="a few hundred calls per scenario, for CI"
    )
    parser.add_argument(
        "--only", metavar="N,M", help="run only these scenarios (numbers, comma-separated)"
    )
    parser.add_argument(
        "--markdown", metavar="PATH", type=Path, help="also write the tables to this file"
    )
    parser.add_argument(
        "--plot",
        metavar="DIR",
        type=Path,
        help="draw the figures as PNG files in DIR (needs matplotlib: the bench extra)",
    )
    parser.add_argument(
        "--pool", choices=get_args(Pool), default="prefork", help="pool of the shared workers"
    )
    parser.add_argument(
        "--concurrency", type=int, default=2, help="concurrency of the shared workers"
    )
    parser.add_argument(
        "--broker",
        choices=("redis", "amqp"),
        default="redis",
        help="carry calls over the private Redis or the machine's RabbitMQ (scenarios 1 and 2)",
    )
    return parser


def _emit(text: str) -> None:
    print(text, flush=True)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)
