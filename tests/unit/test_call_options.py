"""agent_client.options: every way to call a tool takes the same keywords, checked alike,
and resolves them into one CallOptions."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from agent_client.client import ToolClient
from agent_client.options import CallKeywords, CallOptions
from agent_client.remote import RemoteTool
from wire.models import ToolSpec
from wire.settings import Settings


@dataclass
class RecordingClient:
    """Just enough of a ToolClient to see what a call would be sent with (nothing is)."""

    settings: Settings = field(default_factory=Settings)
    seen: list[CallOptions] = field(default_factory=list)

    async def call(self, spec: ToolSpec, arguments: dict[str, Any], options: CallOptions) -> str:
        self.seen.append(options)
        return "sent"

    def call_sync(self, spec: ToolSpec, arguments: dict[str, Any], options: CallOptions) -> str:
        self.seen.append(options)
        return "sent"


def proxy(client: RecordingClient, *, idempotent: bool = True) -> RemoteTool:
    spec = ToolSpec(
        name="search",
        description="Search.",
        parameters={"type": "object"},
        timeout=30.0,
        idempotent=idempotent,
    )
    return RemoteTool(spec, client=cast(ToolClient, client))


def test_the_keywords_are_resolved_into_one_options_object() -> None:
    client = RecordingClient()
    tool = proxy(client)

    tool.invoke_sync({}, timeout=5, run_id="run-1", idempotency_key="k", on_abandon="cancel")
    asyncio.run(tool.invoke({}, framework_timeout=7, started=None))

    assert client.seen == [
        CallOptions(
            timeout=5.0, run_id="run-1", idempotency_key="k", on_abandon="cancel", started=None
        ),
        CallOptions(timeout=7.0),  # the framework's default, as nothing above it is set
    ]
    with pytest.raises(AttributeError):
        client.seen[0].timeout = 1.0  # type: ignore[misc]  # frozen


@pytest.mark.parametrize("way", ["invoke", "invoke_sync", "submit", "submit_async"])
def test_a_keyword_that_is_no_option_is_refused_by_name_and_nothing_is_sent(way: str) -> None:
    client = RecordingClient()
    method = getattr(proxy(client), way)

    with pytest.raises(TypeError, match=r"got \['timout'\].*arguments dict") as refused:
        result = method({}, timout=5)
        if asyncio.iscoroutine(result):
            asyncio.run(result)

    assert all(name in str(refused.value) for name in CallKeywords.__annotations__)
    assert client.seen == []
