"""executor.seams.transport decodes a queue item as kombu does, faster where kombu's
hook cannot apply."""

from __future__ import annotations

import datetime
import json
import uuid

import pytest
from kombu.utils.json import dumps, loads

from executor.seams.transport import _envelope_loads

WHEN = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)


@pytest.mark.parametrize(
    "text",
    [
        json.dumps({"body": "W1tdLHt9XQ==", "headers": {"id": "c1", "expires": WHEN.isoformat()}}),
        dumps({"headers": {"expires": WHEN, "id": uuid.UUID(int=7)}}),  # kombu's typed values
        json.dumps({"headers": {"kwargsrepr": "{'city': 'Zürich'}"}}),  # \u escapes
        '{"h": {"\\u005f_type__": "datetime", "__value__": "2026-12-01T12:00:00"}}',
        json.dumps([1, "two", None, {"nested": {"deep": [True]}}]),
    ],
    ids=["plain", "kombu types", "unicode escapes", "an escaped __type__ key", "no object"],
)
def test_an_item_decodes_to_what_kombus_loads_gives(text: str) -> None:
    assert _envelope_loads(text) == loads(text)


def test_kombus_typed_values_come_back_typed() -> None:
    decoded = _envelope_loads(dumps({"expires": WHEN}))

    assert decoded == {"expires": WHEN}


@pytest.mark.parametrize("text", ["not json", '{"a": ', '{"a": 1} trailing'])
def test_what_kombu_refuses_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        loads(text)
    with pytest.raises(ValueError):
        _envelope_loads(text)
