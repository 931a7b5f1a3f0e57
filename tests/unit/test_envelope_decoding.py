"""executor.seams.transport decodes a queue item, and a message's body, as kombu does,
faster where kombu's hook cannot apply."""

from __future__ import annotations

import datetime
import json
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kombu.exceptions import DecodeError
from kombu.transport import virtual
from kombu.utils.json import dumps, loads

from executor.seams.transport import Message, _envelope_loads

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


# -- a message's body: executor.seams.transport.Message._decode against kombu's --------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
ACCEPT_JSON = {"application/json"}


def message(
    body: Any, *, content_type: str | None = "application/json", accept: Any = ACCEPT_JSON
) -> Message:
    """A message as kombu's constructor leaves it, its body as it arrives."""
    made: Message = Message.__new__(Message)
    made.body, made.content_type, made.content_encoding = body, content_type, "utf-8"
    made.accept, made.headers, made.errors, made._decoded_cache = accept, {}, [], None
    return made


def decoded(decode: Any, made: Message) -> tuple[str, Any]:
    """What ``decode`` gives for ``made``: ``("value", v)``, or ``("raises", error type)``."""
    try:
        return "value", decode(made)
    except Exception as exc:  # noqa: BLE001 - the kind of error is the answer
        return "raises", type(exc)


def kombus(made: Message) -> Any:
    return virtual.Message._decode(made)  # type: ignore[no-untyped-call]


@settings(max_examples=300, deadline=None)
@given(value=JSON_VALUES, as_text=st.booleans(), ascii_only=st.booleans())
def test_a_json_body_decodes_to_what_kombu_gives(
    value: Any, as_text: bool, ascii_only: bool
) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    made = message(text if as_text else text.encode())

    assert decoded(Message._decode, made) == decoded(kombus, made)


@pytest.mark.parametrize(
    "body",
    [
        dumps({"expires": WHEN, "id": uuid.UUID(int=7)}).encode(),  # kombu's typed values
        b'{"h": {"\\u005f_type__": "datetime", "__value__": "2026-12-01T12:00:00"}}',
        b"not json",
        b'{"a": ',
        b"\xff\xfe not utf-8",
        b"",
        memoryview(b'[[], {"a": 1}, {}]'),
        bytearray(b'[[], {"a": 1}, {}]'),
    ],
    ids=["typed", "escaped __type__", "not json", "cut", "not utf-8", "empty", "view", "array"],
)
def test_a_body_decodes_or_fails_as_kombu_decodes_it(body: Any) -> None:
    made = message(body)

    assert decoded(Message._decode, made) == decoded(kombus, made)


@pytest.mark.parametrize(
    ("content_type", "accept"),
    [
        ("application/json", None),
        ("application/json", {"application/x-yaml"}),
        ("application/x-python-serialize", ACCEPT_JSON),
        (None, ACCEPT_JSON),
    ],
)
def test_a_body_not_plainly_accepted_json_is_kombus_to_decode_or_refuse(
    content_type: str | None, accept: Any
) -> None:
    made = message(b'{"a": [1, 2]}', content_type=content_type, accept=accept)

    assert decoded(Message._decode, made) == decoded(kombus, made)


def test_a_bad_body_fails_with_kombus_decode_error() -> None:
    with pytest.raises(DecodeError):
        message(b'{"a": ').decode()
