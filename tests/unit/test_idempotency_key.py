"""The idempotency key and the run scope, without Redis."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from typing import Any

import pytest
from pydantic import BaseModel

from agent_client import current_run_id, run_scope
from agent_client.runs import canonical_arguments, idempotency_key
from executor.schema import function_schema


class Seat(BaseModel):
    row: int = 1
    window: bool = False


class Trip(BaseModel):
    seat: Seat = Seat()
    legs: list[Seat] = []


def _book(
    passenger: str, trip: Trip, seat: Seat | None = None, price: float = 0, count: int = 1
) -> None:
    """Book a trip.

    Args:
        passenger: Who travels.
        trip: The trip.
        seat: A seat preference.
        price: The price.
        count: How many seats.
    """


SCHEMA: dict[str, Any] = function_schema(_book, name="book").parameters


def _key(arguments: dict[str, Any], *, run: str = "run-1", tool: str = "book") -> str:
    return idempotency_key(run, tool, SCHEMA, arguments)


# -- canonical arguments -----------------------------------------------------------------


def test_schema_defaults_are_filled_in() -> None:
    canonical = canonical_arguments(SCHEMA, {"passenger": "Ada", "trip": {}})
    assert canonical == {
        "passenger": "Ada",
        "trip": {"seat": {"row": 1, "window": False}, "legs": []},
        "seat": None,
        "price": 0,
        "count": 1,
    }


def test_a_call_that_spells_out_the_defaults_has_the_key_of_one_that_omits_them() -> None:
    short = _key({"passenger": "Ada", "trip": {}})
    spelled = _key(
        {
            "passenger": "Ada",
            "trip": {"seat": {"row": 1, "window": False}, "legs": []},
            "seat": None,
            "price": 0.0,
            "count": 1,
        }
    )
    assert short == spelled


def test_key_order_does_not_matter_at_any_depth() -> None:
    a = _key({"passenger": "Ada", "trip": {"seat": {"row": 3, "window": True}}})
    b = _key({"trip": {"seat": {"window": True, "row": 3}}, "passenger": "Ada"})
    assert a == b


def test_zero_and_zero_point_zero_are_the_same_argument() -> None:
    assert _key({"passenger": "Ada", "trip": {}, "price": 0}) == _key(
        {"passenger": "Ada", "trip": {}, "price": 0.0}
    )
    assert _key({"passenger": "Ada", "trip": {}, "price": 12}) == _key(
        {"passenger": "Ada", "trip": {}, "price": 12.0}
    )
    assert _key({"passenger": "Ada", "trip": {}, "price": 0.5}) != _key(
        {"passenger": "Ada", "trip": {}, "price": 0}
    )


def test_nested_models_behind_a_ref_get_their_defaults() -> None:
    a = _key({"passenger": "Ada", "trip": {"seat": {}}})
    b = _key({"passenger": "Ada", "trip": {"seat": {"row": 1}}})
    c = _key({"passenger": "Ada", "trip": {}})
    assert a == b == c


def test_models_in_lists_and_optional_models_get_their_defaults() -> None:
    listed = [
        _key({"passenger": "Ada", "trip": {"legs": [leg]}})
        for leg in ({}, {"row": 1}, {"window": False, "row": 1.0})
    ]
    optional = [
        _key({"passenger": "Ada", "trip": {}, "seat": seat})
        for seat in ({}, {"row": 1}, {"window": False})
    ]
    assert len(set(listed)) == 1
    assert len(set(optional)) == 1
    assert _key({"passenger": "Ada", "trip": {}, "seat": None}) not in optional


def test_different_arguments_runs_and_tools_give_different_keys() -> None:
    base = {"passenger": "Ada", "trip": {}}
    key = _key(base)
    assert _key({**base, "passenger": "Grace"}) != key
    assert _key(base, run="run-2") != key
    assert _key(base, tool="book_again") != key
    assert len(key) == 64 and int(key, 16) >= 0  # SHA-256, hex


def test_booleans_are_not_numbers() -> None:
    schema = {"type": "object", "properties": {"flag": {}}}
    assert idempotency_key("r", "t", schema, {"flag": True}) != idempotency_key(
        "r", "t", schema, {"flag": 1}
    )


#: Argument shapes as this process spells them, and as another process spells the same call:
#: keys in another order at every depth, integral floats for ints and back, non-ASCII text.
_SHAPES_HERE: list[dict[str, Any]] = [
    {"passenger": "Ada", "trip": {}},
    {
        "passenger": "Ada",
        "trip": {"seat": {"row": 3, "window": True}, "legs": [{"row": 2, "window": False}, {}]},
        "seat": {"row": 7},
    },
    {"passenger": "Ada", "trip": {}, "price": 1.0, "count": 2},
    {"passenger": "Ada", "trip": {}, "price": 19.99},
    {"passenger": "Zoë Ørsted — 東京 🚀", "trip": {"legs": [{"window": True}]}},
    {"passenger": "Ada", "trip": {}, "note": {"b": [1, {"y": "ü", "x": 2.0}], "a": None}},
]
_SHAPES_THERE: list[dict[str, Any]] = [
    {"trip": {}, "passenger": "Ada"},
    {
        "seat": {"row": 7.0},
        "trip": {"legs": [{"window": False, "row": 2.0}, {}], "seat": {"window": True, "row": 3}},
        "passenger": "Ada",
    },
    {"count": 2.0, "price": 1, "trip": {}, "passenger": "Ada"},
    {"price": 19.99, "trip": {}, "passenger": "Ada"},
    {"trip": {"legs": [{"window": True}]}, "passenger": "Zoë Ørsted — 東京 🚀"},
    {"note": {"a": None, "b": [1.0, {"x": 2, "y": "ü"}]}, "trip": {}, "passenger": "Ada"},
]

_CHILD = """
import json, sys
from agent_client.runs import idempotency_key
job = json.loads(sys.stdin.read())
keys = [idempotency_key("run-1", "book", job["schema"], arguments) for arguments in job["shapes"]]
print(json.dumps({"keys": keys, "hash_of_a_str": hash("run-1")}))
"""


def _keys_in_another_process(shapes: list[dict[str, Any]], hash_seed: str) -> tuple[list[str], int]:
    # The child reads the shapes back from JSON, which keeps key order and int/float as written.
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD],
        input=json.dumps({"schema": SCHEMA, "shapes": shapes}, ensure_ascii=False),
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    return answer["keys"], answer["hash_of_a_str"]


def test_the_key_is_stable_across_processes() -> None:
    here = [_key(arguments) for arguments in _SHAPES_HERE]
    assert len(set(here)) == len(here), "each shape is a different call"

    there_123, str_hash_123 = _keys_in_another_process(_SHAPES_THERE, "123")
    there_456, str_hash_456 = _keys_in_another_process(_SHAPES_THERE, "456")

    # The two children really hash differently, so a key built on hash() would differ between them.
    assert str_hash_123 != str_hash_456
    assert there_123 == here
    assert there_456 == here


# -- run_scope -----------------------------------------------------------------------------


def test_outside_any_scope_there_is_no_run() -> None:
    assert current_run_id() is None


def test_a_sync_scope_sets_the_run_id_and_restores_it() -> None:
    with run_scope("run-a") as run_id:
        assert run_id == "run-a" == current_run_id()
    assert current_run_id() is None


def test_an_async_scope_sets_the_run_id_for_the_tasks_started_inside() -> None:
    async def main() -> tuple[str, list[str | None], str | None]:
        async with run_scope() as run_id:

            async def seen() -> str | None:
                await asyncio.sleep(0)
                return current_run_id()

            inside = list(await asyncio.gather(seen(), seen()))
        return run_id, inside, current_run_id()

    run_id, inside, after = asyncio.run(main())
    assert inside == [run_id, run_id]
    assert after is None


def test_scopes_nest_and_unwind_in_order() -> None:
    with run_scope("outer"):
        with run_scope("inner"):
            assert current_run_id() == "inner"
        assert current_run_id() == "outer"
    assert current_run_id() is None


def test_a_scope_that_raises_still_restores_the_outer_run() -> None:
    with run_scope("outer"):
        with pytest.raises(RuntimeError), run_scope("inner"):
            raise RuntimeError("boom")
        assert current_run_id() == "outer"


def test_each_scope_without_an_id_gets_a_fresh_one() -> None:
    ids = set()
    for _ in range(100):
        with run_scope() as run_id:
            ids.add(run_id)
    assert len(ids) == 100
    assert all(isinstance(i, str) and len(i) == 32 for i in ids)


def test_a_scope_object_can_be_entered_again() -> None:
    scope = run_scope()
    with scope as first:
        pass
    with scope as second:
        assert current_run_id() == first
    assert first == second


def test_other_threads_do_not_see_the_scope() -> None:
    seen: list[str | None] = []
    with run_scope("main-thread"):
        thread = threading.Thread(target=lambda: seen.append(current_run_id()))
        thread.start()
        thread.join()
    assert seen == [None]


@pytest.mark.parametrize("bad", ["", 7, b"run"])
def test_a_run_id_must_be_a_non_empty_string(bad: Any) -> None:
    with pytest.raises(ValueError, match="run_id"):
        run_scope(bad)
