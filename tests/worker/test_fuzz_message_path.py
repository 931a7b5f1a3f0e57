"""A sample of the argument fuzz cases, forged as queue items, through the worker's own path.

``tests/unit/test_fuzz_worker.py`` gives :func:`executor.runner.execute` every category
of bad arguments for every starter tool. Here the same cases are written as a forger
writes them onto a queue (JSON text with ``NaN`` and ``Infinity`` literals and
``"\\ud800"`` escapes, nested as deep as it likes) and fed to the worker's main-process
path (``tests/worker/poison.py``: ``BRPOP``, toolexec's transport, kombu's decoding,
Celery's consumer, the tasks' strategy and request). What kombu decodes then goes the
task's way: :class:`~wire.models.CallRequest` from the keyword arguments, then
``execute`` with the tool's real argument model and a stand-in body.

Each item either is dead-lettered on the path (too large to be a call, or nested deeper
than the JSON decoder goes) or becomes a call that is answered INVALID_ARGUMENTS naming
the field: never an exception, never a tool run with arguments its schema refuses.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from executor.runner import execute
from tests.unit.fuzz_strategies import CATEGORIES, STARTER_TOOLS, field_named, starter
from toolexec import RedisServer
from wire.models import CallRequest, ErrorKind
from wire.settings import Settings

from .poison import MessagePath, dump, envelope, message_path

#: Where both of a case's outcomes come from: refused before decoding, or decoded.
_REFUSED_UNREAD = {"huge strings", "deep nesting"}

SAMPLE = settings(
    max_examples=10,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


@pytest.fixture(scope="module")
def path(redis_server: RedisServer) -> Iterator[MessagePath]:
    """The worker's message path with the default argument limit (1 MiB)."""
    limit = Settings.from_env({}).max_argument_bytes
    with message_path(redis_server.url, ack_emulation=False, max_argument_bytes=limit) as built:
        yield built


class _Raw(str):
    """JSON text already written."""


def forged_json(value: Any) -> str:
    """``value`` as a forger writes it: NaN and Infinity as literals, lone surrogates
    as ``\\ud800`` escapes, any depth (written without recursion)."""
    out: list[str] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Raw):
            out.append(item)
        elif isinstance(item, dict | list):
            pairs = item.items() if isinstance(item, dict) else ((None, child) for child in item)
            parts: list[Any] = []
            for index, (key, child) in enumerate(pairs):
                parts += [_Raw(",")] if index else []
                parts += [_Raw(json.dumps(key) + ":")] if isinstance(item, dict) else []
                parts.append(child)
            out.append("{" if isinstance(item, dict) else "[")
            stack.append(_Raw("}" if isinstance(item, dict) else "]"))
            stack.extend(reversed(parts))
        elif isinstance(item, float) and not math.isfinite(item):
            out.append("NaN" if math.isnan(item) else ("Infinity" if item > 0 else "-Infinity"))
        else:
            out.append(json.dumps(item))
    return "".join(out)


def forged_item(path: MessagePath, tool: str, arguments: dict[str, Any]) -> bytes:
    """A well-formed envelope of a call to ``tool`` whose body carries ``arguments`` as forged."""
    env = envelope(path.queue, tool=tool)
    args, fields, embed = json.loads(base64.b64decode(env["body"]))
    head = json.dumps(
        {name: value for name, value in fields.items() if name != "arguments"} | {"arguments": None}
    )
    body = (
        f"[{json.dumps(args)},{head[: head.rindex('null')]}{forged_json(arguments)}}},"
        f"{json.dumps(embed)}]"
    )
    return dump({**env, "body": base64.b64encode(body.encode()).decode()})


@pytest.mark.parametrize("category", sorted(CATEGORIES))
@SAMPLE
@given(data=st.data())
def test_forged_bad_arguments_are_refused_on_the_path_or_answered_invalid_naming_the_field(
    path: MessagePath, category: str, data: st.DataObject
) -> None:
    # get_today_date requires nothing: no field of it can be missing.
    tools = [
        t
        for t in STARTER_TOOLS
        if category != "missing fields" or starter(t).spec.parameters.get("required")
    ]
    tool = data.draw(st.sampled_from(tools), label="tool")
    case = CATEGORIES[category](data, starter(tool))

    fed = path.feed(forged_item(path, tool, case.arguments))

    assert len(fed.dead_letters) + len(fed.requests) == 1, fed
    event(f"{category}: {'dead-lettered' if fed.dead_letters else 'answered'}")
    if fed.dead_letters:
        assert category in _REFUSED_UNREAD, f"{category} was dead-lettered: {fed.dead_letters}"
        # Nested past the limit (wire/depth.py) but within the decoder's: refused as a call.
        refusals = (
            "too_large",
            "not_json",
            "undecodable",
            *(("invalid_call",) if category == "deep nesting" else ()),
        )
        assert fed.dead_letters[0]["reason"] in refusals, fed.dead_letters
        return
    call = CallRequest.model_validate(fed.requests[0].kwargs)  # what the task body does first
    stand_in = dataclasses.replace(starter(tool), func=lambda **kwargs: kwargs, is_async=False)
    outcome = execute(call, worker="w", definition=stand_in)

    assert outcome.error is not None and outcome.error.kind is ErrorKind.INVALID_ARGUMENTS, outcome
    assert field_named(case.field) in outcome.error.message
