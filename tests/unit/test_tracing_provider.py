"""The worker's cheap look for a tracer provider answers as OpenTelemetry's API does.

``executor.tracing._provider_set`` asks ``trace.get_tracer_provider()`` once and then reads
the module's global (``trace._TRACER_PROVIDER``): each case runs in a fresh interpreter,
since a process sets its provider once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

LOOK = """
from opentelemetry import trace
from executor import tracing

def api() -> bool:
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)

seen = []
"""


def run(body: str, **environ: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(environ)
    script = LOOK + textwrap.dedent(body) + "\nprint(' '.join(seen))\n"
    done = subprocess.run(
        [sys.executable, "-c", script],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_no_provider_is_seen_as_none_every_time() -> None:
    seen = run(
        """
        for _ in range(3):
            seen.append(f"{tracing._provider_set(trace)}/{api()}")
        """
    )
    assert seen == ["False/False"] * 3


def test_a_provider_set_in_code_after_the_first_look_is_seen() -> None:
    seen = run(
        """
        from opentelemetry.sdk.trace import TracerProvider
        seen.append(f"{tracing._provider_set(trace)}/{api()}")
        trace.set_tracer_provider(TracerProvider())
        seen.append(f"{tracing._provider_set(trace)}/{api()}")
        seen.append(f"{tracing._provider_set(trace)}/{api()}")
        """
    )
    assert seen == ["False/False", "True/True", "True/True"]


def test_a_provider_named_by_opentelemetrys_variable_is_seen_from_the_first_look() -> None:
    seen = run(
        """
        for _ in range(2):
            seen.append(str(tracing._provider_set(trace)))
        seen.append(str(api()))
        """,
        OTEL_PYTHON_TRACER_PROVIDER="sdk_tracer_provider",
    )
    assert seen == ["True", "True", "True"]


def test_the_global_it_reads_is_the_one_set_tracer_provider_writes() -> None:
    seen = run(
        """
        from opentelemetry.sdk.trace import TracerProvider
        seen.append(str(trace._TRACER_PROVIDER is None))
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
        seen.append(str(trace._TRACER_PROVIDER is provider))
        """
    )
    assert seen == ["True", "True"]
