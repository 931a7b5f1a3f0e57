"""wire.formats: every string format that crosses Redis parses back to what built it.

The Lua scripts build the same formats; ``tests/worker/test_scripts.py`` parses what
they write on a real Redis with these functions.
"""

from __future__ import annotations

import pytest

from wire.formats import (
    RUNNING_MARK,
    STORED_MARK,
    WAITING_MARK,
    KeyState,
    holder_tag,
    joining_tag,
    parse_frame,
    parse_holder_tag,
    parse_state,
    parse_waiter_entry,
    reply_frame,
    running_state,
    stored_state,
    waiter_entry,
    worker_id_of,
)
from wire.models import CallOutcome, ErrorKind

# -- reply frame ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "outcome",
    [
        CallOutcome.success("call-1", {"text": "line one\nline two", "n": 3}, worker="w@h"),
        CallOutcome.failure("call-2", ErrorKind.EXECUTION, "ValueError", "bad\ninput"),
        CallOutcome.success("call-3", "ünïcødé ✓"),
    ],
    ids=["result with a newline", "error", "unicode"],
)
def test_a_reply_frame_parses_back_to_its_call_id_and_outcome(outcome: CallOutcome) -> None:
    encoded = outcome.model_dump_json()

    call_id, is_progress, body = parse_frame(reply_frame(outcome.call_id, encoded).encode())

    assert (call_id, is_progress) == (outcome.call_id, False)
    assert body == encoded.encode()
    assert CallOutcome.model_validate_json(body) == outcome


def test_a_reply_frame_splits_at_its_first_newline_only() -> None:
    assert parse_frame(b"call-1\n{}\n{}") == ("call-1", False, b"{}\n{}")


def test_a_reply_frame_without_a_newline_is_a_call_id_with_an_empty_body() -> None:
    assert parse_frame(b"call-1") == ("call-1", False, b"")


def test_a_reply_frames_undecodable_call_id_is_replaced_not_raised() -> None:
    assert parse_frame(b"call-\xff\n{}") == ("call-\ufffd", False, b"{}")


# -- waiter entry -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply_to", "call_id"),
    [("client-1", "call-1"), ("a1b2c3", "a call id with spaces"), ("host:42:abc", "7f3e")],
)
def test_a_waiter_entry_parses_back_to_its_client_and_call(reply_to: str, call_id: str) -> None:
    assert parse_waiter_entry(waiter_entry(reply_to, call_id)) == (reply_to, call_id)


@pytest.mark.parametrize(
    "entry", ["no-separator", " call-1", ""], ids=["no space", "no client", "empty"]
)
def test_a_malformed_waiter_entry_parses_to_empty_strings(entry: str) -> None:
    assert parse_waiter_entry(entry) == ("", "")


def test_a_waiter_entry_with_an_empty_call_id_keeps_its_client() -> None:
    assert parse_waiter_entry("client-1 ") == ("client-1", "")


# -- holder tag -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("worker_id", "pid"),
    [("w1@host:100", 101), ("w1@host:100", 0), ("odd|name@host:7", 8)],
    ids=["pool child", "taken, not started", "worker id with a bar"],
)
def test_a_holder_tag_parses_back_to_its_worker_id_and_pid(worker_id: str, pid: int) -> None:
    tag = holder_tag(worker_id, pid)

    assert parse_holder_tag(tag) == (worker_id, pid)
    assert parse_holder_tag(tag.encode()) == (worker_id, pid)
    assert worker_id_of(tag) == worker_id
    assert worker_id_of(tag.encode()) == worker_id


def test_a_holder_tag_without_a_bar_is_all_worker_id_and_pid_zero() -> None:
    assert parse_holder_tag("w1@host:100") == ("w1@host:100", 0)
    assert parse_holder_tag(b"w1@host:100") == ("w1@host:100", 0)


@pytest.mark.parametrize("pid", ["abc", "", "-5", "12x"])
def test_a_holder_tag_whose_pid_is_not_digits_has_pid_zero(pid: str) -> None:
    assert parse_holder_tag(f"w1@host:100|{pid}") == ("w1@host:100", 0)


def test_an_undecodable_holder_tag_is_replaced_not_raised() -> None:
    assert parse_holder_tag(b"w\xff@host:1|2") == ("w\ufffd@host:1", 2)


@pytest.mark.parametrize(
    ("worker_id", "pid"),
    [("w1@host:100", 101), ("w1@host:100", 0), ("odd|name@host:7", 8)],
    ids=["pool child", "taken, not started", "worker id with a bar"],
)
def test_a_joining_tag_names_the_same_process_yet_is_another_string(
    worker_id: str, pid: int
) -> None:
    tag = holder_tag(worker_id, pid)

    joining = joining_tag(tag)

    assert joining != tag
    assert joining == holder_tag(worker_id, pid, joining=True)
    assert parse_holder_tag(joining) == (worker_id, pid)
    assert joining_tag(tag.encode()) == joining


def test_a_joining_tag_reads_as_its_process_to_a_parser_that_knows_only_plain_tags() -> None:
    # What a client or worker older than joining tags does: the pid is the number after
    # the last bar.
    worker_id, _, pid = joining_tag(holder_tag("w1@host:100", 101)).rpartition("|")

    assert (worker_id, int(pid)) == ("w1@host:100", 101)


# -- key state --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "state"),
    [
        (running_state("w1@host:100|101"), KeyState(holder="w1@host:100|101")),
        (
            running_state("w1@host:100|101", waiters=True),
            KeyState(holder="w1@host:100|101", waiters=True),
        ),
        (running_state("", waiters=True), KeyState(waiters=True)),
        (
            stored_state('{"ok": true, "text": "run:x"}'),
            KeyState(outcome='{"ok": true, "text": "run:x"}'),
        ),
        (stored_state(""), KeyState(outcome="")),
    ],
    ids=["held", "held, callers joined", "callers joined, nobody began", "stored", "stored, empty"],
)
def test_a_key_state_parses_back_to_what_built_it(value: str, state: KeyState) -> None:
    assert parse_state(value) == state
    assert parse_state(value.encode()) == state


def test_a_missing_key_state_is_free() -> None:
    assert parse_state(None) == KeyState(holder="", waiters=False, outcome=None)


def test_a_key_state_in_no_known_shape_reads_as_a_holder_never_as_free_or_stored() -> None:
    # Whoever meets it finds that holder dead and takes over: nothing is taken as stored.
    assert parse_state("w1@host:100|101") == KeyState(holder="w1@host:100|101")


def test_the_marks_of_a_key_state_are_prefixes_no_holder_tag_or_outcome_starts_with() -> None:
    marks = (RUNNING_MARK, WAITING_MARK, STORED_MARK)

    assert len(set(marks)) == 3
    assert not any(a != b and a.startswith(b) for a in marks for b in marks)
    assert not any(holder_tag("w1@host:100", 101).startswith(m) for m in marks)
    assert not any(CallOutcome.success("c", 1).model_dump_json().startswith(m) for m in marks)
