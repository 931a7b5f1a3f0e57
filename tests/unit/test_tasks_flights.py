from __future__ import annotations

import multiprocessing
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import pydantic
import pytest

import tasks._settings
from executor import get_tool
from executor.runner import execute
from executor.schema import function_schema
from tasks.flights import book_flight, ledger_path, list_bookings
from wire.models import CallOutcome, CallRequest
from wire.settings import Settings


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "data"
    settings = Settings(data_dir=str(folder))
    monkeypatch.setattr(tasks._settings, "settings", lambda: settings)
    return folder


def test_book_flight_writes_one_ledger_row_per_call(data_dir: Path) -> None:
    first = book_flight("BA117", "Ada Lovelace")
    second = book_flight("BA117", "Ada Lovelace")

    rows = list_bookings(data_dir)
    assert [row["booking_id"] for row in rows] == [first["booking_id"], second["booking_id"]]
    assert first["booking_id"] != second["booking_id"]


def test_book_flight_returns_the_booking_it_stored(data_dir: Path) -> None:
    booking = book_flight("U21234", "Grace Hopper")

    (row,) = list_bookings()
    stored = {key: value for key, value in row.items() if key in booking}
    assert booking == stored
    assert (booking["flight_id"], booking["passenger"]) == ("U21234", "Grace Hopper")
    assert booking["booking_id"].startswith("BK-")
    assert datetime.fromisoformat(booking["created_at"]).tzinfo is not None


def test_book_flight_called_directly_records_no_call(data_dir: Path) -> None:
    book_flight("LH9", "Alan Turing")

    (row,) = list_bookings(data_dir)
    assert (row["call_id"], row["idempotency_key"]) == (None, None)


def test_book_flight_run_by_a_worker_records_its_call_id_and_idempotency_key(
    data_dir: Path,
) -> None:
    definition = get_tool("book_flight")
    assert definition is not None
    request = CallRequest(
        call_id="call-1",
        tool="book_flight",
        arguments={"flight_id": "AF1", "passenger": "  Marie Curie  "},
        idempotency_key="run-1:book_flight:abc",
    )

    outcome = execute(request, definition=definition)

    assert outcome.ok, outcome.error
    (row,) = list_bookings(data_dir)
    assert row["booking_id"] == outcome.result["booking_id"]
    assert row["passenger"] == "Marie Curie"
    assert (row["call_id"], row["idempotency_key"]) == ("call-1", "run-1:book_flight:abc")


def test_a_second_run_under_the_same_idempotency_key_gets_the_first_booking_and_writes_none(
    data_dir: Path,
) -> None:
    # An at-least-once call re-run after its worker died between the insert and storing
    # its outcome: the key is a unique column, so the side effect happens once.
    definition = get_tool("book_flight")
    assert definition is not None

    def run(call_id: str, key: str, passenger: str) -> CallOutcome:
        request = CallRequest(
            call_id=call_id,
            tool="book_flight",
            idempotency_key=key,
            arguments={"flight_id": "AF1", "passenger": passenger},
        )
        return execute(request, definition=definition)

    first = run("call-1", "run-1:book_flight:abc", "Marie Curie")
    again = run("call-1", "run-1:book_flight:abc", "Marie Curie")
    other = run("call-2", "run-1:book_flight:def", "Pierre Curie")

    assert first.ok and again.ok and other.ok
    assert again.result == first.result
    rows = list_bookings(data_dir)
    assert [row["booking_id"] for row in rows] == [
        first.result["booking_id"],
        other.result["booking_id"],
    ]


def test_the_ledger_lives_in_the_data_dir_and_uses_wal(data_dir: Path) -> None:
    book_flight("KL1001", "Niels Bohr")

    assert ledger_path() == data_dir / "ledger.sqlite3"
    db = sqlite3.connect(ledger_path())
    try:
        (mode,) = db.execute("PRAGMA journal_mode").fetchone()
    finally:
        db.close()
    assert mode == "wal"


def test_list_bookings_is_empty_before_the_first_booking(data_dir: Path) -> None:
    assert list_bookings() == []
    assert not data_dir.exists()


def test_concurrent_bookings_from_many_connections_are_all_kept(data_dir: Path) -> None:
    def book(n: int) -> str:
        return book_flight(f"BA{n % 10}", f"Passenger {n}")["booking_id"]

    with ThreadPoolExecutor(max_workers=8) as pool:
        booked = list(pool.map(book, range(80)))

    stored = [row["booking_id"] for row in list_bookings(data_dir)]
    assert sorted(stored) == sorted(booked)
    assert len(set(stored)) == 80


def _book_in_a_fresh_process(args: tuple[str, int, Any]) -> list[str]:
    folder, first, start = args
    settings = Settings(data_dir=folder)
    tasks._settings.settings = lambda: settings  # a spawned child: its own module state
    start.wait()
    return [book_flight("BA117", f"Passenger {n}")["booking_id"] for n in range(first, first + 20)]


def test_processes_opening_a_new_ledger_at_once_keep_every_booking(data_dir: Path) -> None:
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        start = manager.Event()
        with context.Pool(4) as pool:
            pending = pool.map_async(
                _book_in_a_fresh_process, [(str(data_dir), n * 20, start) for n in range(4)]
            )
            start.set()
            booked = [booking for batch in pending.get(timeout=60) for booking in batch]

    stored = [row["booking_id"] for row in list_bookings(data_dir)]
    assert len(booked) == 80
    assert sorted(stored) == sorted(booked)


@pytest.mark.parametrize(
    "flight_id", ["", "ba117", "BA 117", "BA-117", "B", "BA", "BA12345", "BAA117", "BA117X"]
)
def test_book_flight_schema_rejects_malformed_flight_ids(flight_id: str) -> None:
    model = function_schema(book_flight, name="book_flight").model

    with pytest.raises(pydantic.ValidationError, match="flight_id"):
        model.model_validate({"flight_id": flight_id, "passenger": "Ada Lovelace"})


@pytest.mark.parametrize("passenger", ["", "   ", "x" * 101])
def test_book_flight_schema_rejects_empty_or_overlong_passenger_names(passenger: str) -> None:
    model = function_schema(book_flight, name="book_flight").model

    with pytest.raises(pydantic.ValidationError, match="passenger"):
        model.model_validate({"flight_id": "BA117", "passenger": passenger})


def test_book_flight_schema_tells_the_model_the_flight_id_format() -> None:
    flight_id = function_schema(book_flight, name="book_flight").parameters["properties"][
        "flight_id"
    ]

    assert flight_id["pattern"] == r"^[A-Z0-9]{2}[0-9]{1,4}$"
    assert "BA117" in flight_id["description"]
