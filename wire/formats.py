"""Every string format that crosses Redis, each built and parsed by one function.

* **Reply frame** ``<call id>\\n<outcome JSON>``: what a worker pushes onto a client's
  reply list. One stored outcome can be addressed to every caller that joined it.
* **Progress frame** ``<call id>\\x1fprogress\\n<progress JSON>``: a running tool's
  progress, pushed onto the same reply list before its outcome. :func:`parse_frame`
  reads both kinds. A parser that knows only reply frames (it splits at the first
  newline) reads ``<call id>\\x1fprogress`` as a call id nobody waits for and drops it,
  so an old client never mistakes progress for an outcome.
* **Waiter entry** ``<client id> <call id>``: a caller waiting for an idempotent call,
  kept in its waiters list until the call completes.
* **Holder tag** ``<worker id>|<pid>``: which process holds a call, so a waiting client
  or a redelivery can tell whether it is still alive. The worker id is
  ``<node name>:<main pid>``; pid 0 means "taken, not yet started in a process".
  The scripts compare tags as strings; everything else reads them with
  :func:`parse_holder_tag`. A *joining* tag (:func:`joining_tag`) writes the pid with a
  leading zero, ``<worker id>|0<pid>``: it names the same process to every parser (the
  pid is read as a number, by this version and by older ones) and is yet another
  string to the scripts. A delivery that must join a call another delivery of its own
  process is running begins under it: the begin script then sees a live holder (not
  this process's own stale marker, which it would take again) and joins as a waiter,
  and its complete step leaves the running delivery's marker alone.
* **Key state** (:func:`running_state`, :func:`stored_state`, :func:`parse_state`):
  the one worker-side record of an idempotency key (:func:`wire.keys.state`), in one
  of three shapes. ``run:<holder tag>``: a delivery runs it and nobody waits;
  ``wait:<holder tag>``: callers joined and wait to be told (``wait:`` alone when
  they joined before any delivery began); ``done:<outcome JSON>``: its stored outcome.
  One key, so a worker begins with one ``SET NX`` (nothing runs, nothing is stored)
  and stores with one ``SET ... GET``, whose previous value says whether anyone
  joined. The marks are plain prefixes: the scripts test them with ``string.sub``.

The Lua scripts in :mod:`wire.scripts` build frames from waiter entries themselves;
``tests/worker/test_scripts.py`` runs them on a real Redis and parses what they
write with these functions, so the two cannot drift apart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = [
    "PROGRESS_MARK",
    "PROGRESS_MESSAGE_MAX",
    "RUNNING_MARK",
    "STORED_MARK",
    "WAITING_MARK",
    "KeyState",
    "encode_progress",
    "holder_tag",
    "joining_tag",
    "parse_frame",
    "parse_holder_tag",
    "parse_progress",
    "parse_state",
    "parse_waiter_entry",
    "progress_frame",
    "reply_frame",
    "running_state",
    "stored_state",
    "waiter_entry",
    "worker_id_of",
]


def reply_frame(call_id: str, encoded_outcome: str) -> str:
    """A reply as it travels: ``<call id>\\n<outcome JSON>``."""
    return f"{call_id}\n{encoded_outcome}"


#: What follows the call id in a progress frame, before the newline.
PROGRESS_MARK = "\x1fprogress"
#: A progress message is cut to this many characters.
PROGRESS_MESSAGE_MAX = 1000


def progress_frame(call_id: str, encoded_progress: str) -> str:
    """A progress report as it travels: ``<call id>\\x1fprogress\\n<progress JSON>``."""
    return f"{call_id}{PROGRESS_MARK}\n{encoded_progress}"


def parse_frame(frame: bytes) -> tuple[str, bool, bytes]:
    """Split a reply or progress frame: (call id, whether it is progress, body left unparsed).

    The frame splits at its first newline (an outcome's JSON may hold more); a call id
    that does not decode is replaced, not raised; a frame without a newline has an
    empty body.
    """
    head, _, body = frame.partition(b"\n")
    call_id = head.decode(errors="replace")
    if call_id.endswith(PROGRESS_MARK):
        return call_id[: -len(PROGRESS_MARK)], True, body
    return call_id, False, body


def encode_progress(seq: int, done: float, total: float | None, message: str | None) -> str:
    """A progress report as JSON: ``{"seq": .., "done": .., "total": .., "message": ..}``.

    ``seq`` numbers one call's reports in the order the tool made them, so a reader that
    sees a frame twice (read again after a lost connection) can drop the repeat. The
    message is cut to :data:`PROGRESS_MESSAGE_MAX` characters.

    Raises:
        ValueError: ``done`` or ``total`` is not a finite number.
    """
    if message is not None:
        message = message[:PROGRESS_MESSAGE_MAX]
    return json.dumps(
        {"seq": seq, "done": done, "total": total, "message": message},
        allow_nan=False,
        ensure_ascii=False,
    )


def parse_progress(body: bytes | str) -> tuple[int, float, float | None, str | None]:
    """``(seq, done, total, message)`` of a progress report's JSON.

    Raises:
        ValueError: The body is not a progress report.
    """
    try:
        data = json.loads(body)
        seq, done, total, message = data["seq"], data["done"], data["total"], data["message"]
    except (TypeError, KeyError, ValueError) as exc:
        raise ValueError(f"not a progress report: {exc}") from None
    valid = (
        _is_number(seq)
        and int(seq) == seq
        and _is_number(done)
        and (total is None or _is_number(total))
        and (message is None or isinstance(message, str))
    )
    if not valid:
        raise ValueError(f"not a progress report: {data!r:.200}")
    return int(seq), float(done), None if total is None else float(total), message


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def waiter_entry(reply_to: str, call_id: str) -> str:
    """A caller's entry in an idempotent call's waiters list: ``<client id> <call id>``."""
    return f"{reply_to} {call_id}"


def parse_waiter_entry(entry: str) -> tuple[str, str]:
    """``(client id, call id)`` of a waiter entry; empty strings if it is malformed."""
    reply_to, sep, call_id = entry.partition(" ")
    return (reply_to, call_id) if sep and reply_to else ("", "")


def holder_tag(worker_id: str, pid: int, *, joining: bool = False) -> str:
    """The tag of the process holding a call: ``<worker id>|<pid>``.

    ``joining`` spells it as a joining delivery's, ``<worker id>|0<pid>`` (see the module).
    """
    return f"{worker_id}|0{pid}" if joining else f"{worker_id}|{pid}"


def joining_tag(tag: str | bytes) -> str:
    """The tag of a delivery joining the call that ``tag``'s delivery, of the same
    process, is running: ``<worker id>|0<pid>`` (see the module).

    It parses to the same worker and pid as ``tag`` and, unless ``tag`` is a joining
    tag itself, differs from it as a string.
    """
    wid, pid = parse_holder_tag(tag)
    return holder_tag(wid, pid, joining=True)


def parse_holder_tag(tag: str | bytes) -> tuple[str, int]:
    """Split a holder tag into the worker id and the pid (0 when the pid is missing).

    The pid is read as a number, so a joining tag's leading zero (:func:`joining_tag`)
    names the same process.
    """
    text = tag.decode(errors="replace") if isinstance(tag, bytes) else tag
    wid, sep, pid = text.rpartition("|")
    if not sep:
        return text, 0
    return wid, int(pid) if pid.isdigit() else 0


def worker_id_of(tag: str | bytes) -> str:
    """The worker id in a holder tag."""
    return parse_holder_tag(tag)[0]


#: A key's state while a delivery runs it and nobody waits: ``run:<holder tag>``.
RUNNING_MARK = "run:"
#: A key's state while callers wait to be told: ``wait:<holder tag>`` (or ``wait:``).
WAITING_MARK = "wait:"
#: A key's state once its outcome is stored: ``done:<outcome JSON>``.
STORED_MARK = "done:"


def running_state(holder: str, *, waiters: bool = False) -> str:
    """A key's state while ``holder`` runs it: ``run:<holder>``, or ``wait:<holder>``
    when callers joined (``holder`` is "" when they joined before anyone began)."""
    return f"{WAITING_MARK if waiters else RUNNING_MARK}{holder}"


def stored_state(encoded_outcome: str) -> str:
    """A key's state once its outcome is stored: ``done:<outcome JSON>``."""
    return f"{STORED_MARK}{encoded_outcome}"


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyState:
    """What a key's state says (:func:`parse_state`).

    Attributes:
        holder: The tag of the delivery running the key; "" when none has begun, or
            the outcome is stored.
        waiters: Callers joined the execution and wait to be told of its outcome.
        outcome: The stored outcome's JSON, or None while nothing is stored.
    """

    holder: str = ""
    waiters: bool = False
    outcome: str | None = None


def parse_state(value: bytes | str | None) -> KeyState:
    """What a key's state value says; a missing key (None) is free: nothing runs, nothing
    is stored. A value in no known shape reads as the tag of a holder (whom the begin
    step then finds dead), never as free."""
    if value is None:
        return KeyState()
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    if text.startswith(STORED_MARK):
        return KeyState(outcome=text[len(STORED_MARK) :])
    if text.startswith(WAITING_MARK):
        return KeyState(holder=text[len(WAITING_MARK) :], waiters=True)
    return KeyState(holder=text.removeprefix(RUNNING_MARK))
