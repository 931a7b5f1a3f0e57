"""The ``book_flight`` tool: a side effect that must not happen twice by accident.

A booking is one row in a SQLite ledger, ``<data_dir>/ledger.sqlite3``, which several
worker processes may write at once: the ledger uses WAL and a busy timeout, and each
booking is one short transaction in :func:`_insert_booking`. The row keeps the call id
and, for idempotent calls, the idempotency key, so a duplicate can be traced to the
call that made it. A booking made under an idempotency key is made once per key: the
key is a unique column, and a second run of the same call (an at-least-once call whose
worker died after the insert but before its outcome was stored) gets the booking the
first run made. That is the pattern ``docs/guarantees.md`` asks of a tool whose side
effect must not repeat. :func:`list_bookings` reads the ledger back (tests and the demo
count bookings with it); it is a plain function, not a tool.
"""

from __future__ import annotations

import contextlib
import fcntl
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypedDict

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
);
CREATE UNIQUE INDEX IF NOT EXISTS bookings_by_idempotency_key
    ON bookings (idempotency_key) WHERE idempotency_key IS NOT NULL;
"""

#: Every column of a booking, in :class:`LedgerRow`'s order (:func:`_ledger_row`).
_SELECT_ROWS = (
    "SELECT booking_id, flight_id, passenger, created_at, call_id, idempotency_key FROM bookings"
)


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
        rows = db.execute(f"{_SELECT_ROWS} ORDER BY rowid").fetchall()
    return [_ledger_row(row) for row in rows]


def _insert_booking(
    path: Path,
    *,
    flight_id: str,
    passenger: str,
    call_id: str | None,
    idempotency_key: str | None,
) -> LedgerRow:
    """Write one booking in one transaction and return the stored row.

    Under an idempotency key that already has a booking, nothing is written and that
    booking is returned.
    """
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
            "INSERT OR IGNORE INTO bookings (booking_id, flight_id, passenger, created_at, "
            "call_id, idempotency_key) VALUES (:booking_id, :flight_id, :passenger, "
            ":created_at, :call_id, :idempotency_key)",
            row,
        )
        if idempotency_key is None:
            return row
        stored = db.execute(
            f"{_SELECT_ROWS} WHERE idempotency_key = ?", (idempotency_key,)
        ).fetchone()
    return _ledger_row(stored)


def _ledger_row(values: tuple[Any, ...]) -> LedgerRow:
    """A row of :data:`_SELECT_ROWS` as a :class:`LedgerRow`."""
    booking_id, flight_id, passenger, created_at, call_id, idempotency_key = values
    return LedgerRow(
        booking_id=booking_id,
        flight_id=flight_id,
        passenger=passenger,
        created_at=created_at,
        call_id=call_id,
        idempotency_key=idempotency_key,
    )


@contextlib.contextmanager
def _ledger(path: Path) -> Iterator[sqlite3.Connection]:
    """A connection to the ledger at ``path``, created on first use, closed on exit."""
    _prepare(path)
    db = sqlite3.connect(path, timeout=_BUSY_TIMEOUT_SECONDS)
    try:
        yield db
    finally:
        db.close()


_prepared: set[Path] = set()
_prepared_lock = threading.Lock()


def _prepare(path: Path) -> None:
    """Create the ledger's folder, WAL mode and table once per process.

    Switching a file to WAL takes an exclusive lock for which SQLite does not wait on
    its busy timeout, so two connections doing it at once fail with "database is
    locked". The switch therefore happens under an ``flock`` on a lock file beside the
    ledger, which every process waits for; the mode is stored in the file, so each
    process does it at most once.
    """
    with _prepared_lock:
        if path in _prepared and path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            db = sqlite3.connect(path, timeout=_BUSY_TIMEOUT_SECONDS)
            try:
                (mode,) = db.execute("PRAGMA journal_mode").fetchone()
                if mode != "wal":
                    db.execute("PRAGMA journal_mode=WAL")
                db.executescript(_SCHEMA)
            finally:
                db.close()
        _prepared.add(path)
