"""The ``book_flight`` tool: a side effect that must not happen twice by accident.

A booking is one row in a SQLite ledger, ``<data_dir>/ledger.sqlite3``, which several
worker processes may write at once: the ledger uses WAL and a busy timeout, and each
booking is one short transaction in :func:`_insert_booking`. The row keeps the call id
and, for idempotent calls, the idempotency key, so a duplicate can be traced to the
call that made it. :func:`list_bookings` reads the ledger back (tests and the demo
count bookings with it); it is a plain function, not a tool.
"""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, TypedDict

from pydantic import Field, StringConstraints

from executor import current_call, tool
from tasks import _settings

__all__ = ["Booking", "LedgerRow", "book_flight", "ledger_path", "list_bookings"]

#: Two letters or digits (the airline code), then 1 to 4 digits: BA117, U21234, LH9.
FLIGHT_ID_PATTERN = r"^[A-Z0-9]{2}[0-9]{1,4}$"
LEDGER_FILE = "ledger.sqlite3"
_BUSY_TIMEOUT_SECONDS = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS bookings (
    booking_id      TEXT PRIMARY KEY,
    flight_id       TEXT NOT NULL,
    passenger       TEXT NOT NULL,
    created_at      TEXT NOT NULL,
    call_id         TEXT,
    idempotency_key TEXT
)
"""


class Booking(TypedDict):
    """What ``book_flight`` returns: the confirmed booking."""

    booking_id: str
    flight_id: str
    passenger: str
    created_at: str


class LedgerRow(Booking):
    """A booking as stored: with the call that made it."""

    call_id: str | None
    idempotency_key: str | None


@tool
def book_flight(
    flight_id: Annotated[str, Field(pattern=FLIGHT_ID_PATTERN)],
    passenger: Annotated[
        str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100)
    ],
) -> Booking:
    """Book one seat on a flight for one passenger, and return the confirmed booking.

    This makes a real booking each time it runs: call it once per seat the user
    asked for, and do not call it again to check or repeat a booking that already
    succeeded. The result has the `booking_id` to give the user, the `flight_id`,
    the `passenger` and `created_at` (UTC, ISO 8601).

    Args:
        flight_id: The flight number: the two-character airline code in capital
            letters or digits, then 1 to 4 digits, with no space, e.g. "BA117" or
            "U21234".
        passenger: The passenger's full name as on their passport, e.g. "Ada Lovelace"
            (1 to 100 characters).
    """
    call_id: str | None = None
    idempotency_key: str | None = None
    try:
        call = current_call()
    except LookupError:
        pass  # called directly, not by a worker: nothing to record
    else:
        call_id, idempotency_key = call.call_id, call.idempotency_key
    row = _insert_booking(
        ledger_path(),
        flight_id=flight_id,
        passenger=passenger,
        call_id=call_id,
        idempotency_key=idempotency_key,
    )
    return Booking(
        booking_id=row["booking_id"],
        flight_id=row["flight_id"],
        passenger=row["passenger"],
        created_at=row["created_at"],
    )


def ledger_path(data_dir: str | Path | None = None) -> Path:
    """The ledger file in ``data_dir`` (default: the settings' ``data_dir``)."""
    folder = _settings.data_dir() if data_dir is None else Path(data_dir).expanduser()
    return folder / LEDGER_FILE


def list_bookings(data_dir: str | Path | None = None) -> list[LedgerRow]:
    """Every booking in the ledger, oldest first; empty when there is no ledger yet.

    Args:
        data_dir: The folder holding ``ledger.sqlite3``; the settings' ``data_dir``
            when omitted.
    """
    path = ledger_path(data_dir)
    if not path.exists():
        return []
    with _ledger(path) as db:
        rows = db.execute(
            "SELECT booking_id, flight_id, passenger, created_at, call_id, idempotency_key "
            "FROM bookings ORDER BY rowid"
        ).fetchall()
    return [
        LedgerRow(
            booking_id=booking_id,
            flight_id=flight_id,
            passenger=passenger,
            created_at=created_at,
            call_id=call_id,
            idempotency_key=idempotency_key,
        )
        for booking_id, flight_id, passenger, created_at, call_id, idempotency_key in rows
    ]


def _insert_booking(
    path: Path,
    *,
    flight_id: str,
    passenger: str,
    call_id: str | None,
    idempotency_key: str | None,
) -> LedgerRow:
    """Write one booking in one transaction and return the stored row."""
    row = LedgerRow(
        booking_id="BK-" + uuid.uuid4().hex[:12].upper(),
        flight_id=flight_id,
        passenger=passenger,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        call_id=call_id,
        idempotency_key=idempotency_key,
    )
    with _ledger(path) as db, db:
        db.execute(
            "INSERT INTO bookings (booking_id, flight_id, passenger, created_at, call_id, "
            "idempotency_key) VALUES (:booking_id, :flight_id, :passenger, :created_at, "
            ":call_id, :idempotency_key)",
            row,
        )
    return row


@contextlib.contextmanager
def _ledger(path: Path) -> Iterator[sqlite3.Connection]:
    """A connection to the ledger at ``path``, created on first use, closed on exit."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, timeout=_BUSY_TIMEOUT_SECONDS)
    try:
        # WAL lets readers and one writer work at once across processes; the mode is
        # stored in the file, so this is a no-op after the first connection.
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(_SCHEMA)
        yield db
    finally:
        db.close()
