"""executor.pools.trace: the asyncio pool's trace builds what Celery's trace would."""

from __future__ import annotations

from typing import Any

import pytest
from celery.app.task import Context

from executor.pools.trace import AsyncTrace, request_context


def a_request(**extra: Any) -> dict[str, Any]:
    """A request dict as Celery's worker hands it to a pool (headers, properties, the
    body's args)."""
    return {
        "lang": "py",
        "task": "toolexec.run_tool",
        "id": "c1",
        "shadow": "search",
        "eta": None,
        "expires": "2026-12-01T00:00:00+00:00",
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": [None, None],
        "root_id": "c1",
        "parent_id": None,
        "argsrepr": "()",
        "kwargsrepr": "{'tool': 'search'}",
        "origin": "agent",
        "ignore_result": True,
        "properties": {"delivery_tag": "t"},
        "reply_to": None,
        "correlation_id": "c1",
        "hostname": "w@h",
        "delivery_info": {"exchange": "", "routing_key": "default", "redelivered": False},
        "args": [],
        "kwargs": {"call_id": "c1"},
        **extra,
    }


@pytest.mark.parametrize(
    "extra",
    [{}, {"toolexec_signature": "v1:abc", "traceparent": "00-ab-cd-01"}, {"headers": {"x": 1}}],
    ids=["no custom headers", "custom headers", "headers given"],
)
def test_the_request_context_is_the_one_celerys_constructor_builds(extra: dict[str, Any]) -> None:
    request = a_request(**extra)
    args, kwargs = request["args"], request["kwargs"]

    ours = request_context(request, args, kwargs)
    celerys = Context(request, args=args, called_directly=False, kwargs=kwargs)

    assert type(ours) is Context
    assert vars(ours) == vars(celerys)
    assert ours.headers == celerys.headers


def test_the_trace_takes_the_arguments_celerys_request_decoded_and_decodes_only_without_them() -> (
    None
):
    trace = AsyncTrace(hostname="w@h", accept={"application/json"}, offload=None)  # type: ignore[arg-type]
    body = b'[[], {"call_id": "from-the-body"}, {"callbacks": null}]'

    decoded = a_request()
    assert trace._arguments(decoded, body, "application/json", "utf-8") == (
        [],
        {"call_id": "c1"},
        None,
    )
    undecoded = {k: v for k, v in a_request().items() if k not in ("args", "kwargs")}
    assert trace._arguments(undecoded, body, "application/json", "utf-8") == [
        [],
        {"call_id": "from-the-body"},
        {"callbacks": None},
    ]
