"""``python -m bench.signing``: what message signing costs per call, in microseconds.

Signing needs no Redis and no worker: the client signs in ``prepare_call`` (one short
``json.dumps`` and one HMAC over bytes it built anyway) and the worker verifies from
the keyword arguments it decoded (the arguments encoded again, and one HMAC). This
times, for arguments of a few sizes:

- ``prepare``: ``prepare_call`` without a key and with one, and the difference;
- ``sign``: :func:`wire.signing.sign` alone;
- ``verify``: :func:`wire.signing.verify` alone, on the decoded message.

Each figure is the median of ``--repeats`` runs of ``--calls`` calls.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from agent_client.prepare import PreparedCall, prepare_call
from agent_client.validation import ArgumentValidator
from wire.models import ToolSpec, task_name_for
from wire.settings import Settings
from wire.signing import SIGNATURE_HEADER, sign, verify

__all__ = ["main", "measure"]

KEY = "bench-signing-key-0123456789abcdef"
SPEC = ToolSpec(name="search", description="d", parameters={"type": "object"})
SIZES = {"small (40 B)": 40, "1 KiB": 1024, "64 KiB": 65_536}


def _arguments(size: int) -> dict[str, Any]:
    return {"query": "fox grapes", "limit": 5, "padding": "x" * max(0, size - 40)}


def _per_call_us(run: Callable[[], object], calls: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter_ns()
        for _ in range(calls):
            run()
        samples.append((time.perf_counter_ns() - started) / calls / 1000)
    return statistics.median(samples)


def measure(size: int, *, calls: int, repeats: int) -> dict[str, float]:
    """Microseconds per call for arguments of about ``size`` bytes of JSON."""
    arguments = _arguments(size)
    plain = Settings.from_env({})
    keyed = Settings.from_env({"TOOLEXEC_SIGNING_KEY": KEY})
    validator = ArgumentValidator(SPEC.name, SPEC.parameters, max_bytes=plain.max_argument_bytes)

    def prepare(settings: Settings) -> PreparedCall:
        return prepare_call(
            SPEC,
            arguments,
            validator=validator,
            settings=settings,
            call_id="client-1",
            reply_to="client",
            timeout=30.0,
            run_id=None,
            idempotency_key=None,
            origin="bench",
        )

    call = prepare(keyed)
    envelope = json.loads(call.envelope)
    _args, fields, _embed = json.loads(base64.b64decode(envelope["body"]))
    headers = envelope["headers"]
    signature = headers[SIGNATURE_HEADER]
    task = task_name_for(SPEC.delivery)
    encoded = validator.check(arguments)
    request = call.request
    assert verify(KEY, signature, task, fields, headers=headers) is None

    def signing() -> str:
        return sign(
            KEY,
            task,
            call_id=request.call_id,
            tool=request.tool,
            reply_to=request.reply_to,
            deadline=request.deadline,
            run_id=None,
            idempotency_key=None,
            arguments_json=encoded,
            headers=headers,
        )

    unsigned = _per_call_us(lambda: prepare(plain), calls, repeats)
    signed = _per_call_us(lambda: prepare(keyed), calls, repeats)
    return {
        "prepare_unsigned": unsigned,
        "prepare_signed": signed,
        "prepare_difference": signed - unsigned,
        "sign": _per_call_us(signing, calls, repeats),
        "verify": _per_call_us(
            lambda: verify(KEY, signature, task, fields, headers=headers), calls, repeats
        ),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table; ``--json`` prints the figures as JSON instead."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.signing", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--calls", type=int, default=2000, help="calls per run (default 2000)")
    parser.add_argument(
        "--repeats", type=int, default=5, help="runs; the median is shown (default 5)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    results = {
        label: measure(size, calls=args.calls, repeats=args.repeats)
        for label, size in SIZES.items()
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(
        f"message signing, microseconds per call (median of {args.repeats} runs of {args.calls} "
        "calls)"
    )
    print(
        f"machine: {os.cpu_count()} CPUs, load average {load} (other work inflates these figures)"
    )
    print(
        f"{'arguments':<14}{'prepare':>10}{'+ signed':>10}{'= extra':>10}"
        f"{'sign':>10}{'verify':>10}{'sign+verify':>13}"
    )
    for label, r in results.items():
        print(
            f"{label:<14}{r['prepare_unsigned']:>10.1f}{r['prepare_signed']:>10.1f}{r['prepare_difference']:>10.1f}"
            f"{r['sign']:>10.1f}{r['verify']:>10.1f}{r['sign'] + r['verify']:>13.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
