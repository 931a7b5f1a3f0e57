"""Progress without a network: the frame format, report_progress's checks, the caller's sink."""

from __future__ import annotations

import asyncio
import math
import threading

import pytest

from agent_client.progress import ProgressEvent, ProgressSink
from executor import report_progress
from wire.formats import (
    PROGRESS_MESSAGE_MAX,
    encode_progress,
    parse_frame,
    parse_progress,
    progress_frame,
    reply_frame,
)


def test_a_progress_frame_round_trips_and_is_told_from_an_outcome_frame() -> None:
    frame = progress_frame("client-7", encode_progress(3, 2.5, 10, "Zoë 🦊")).encode()

    assert parse_frame(frame) == ("client-7", True, frame.split(b"\n", 1)[1])
    assert parse_progress(parse_frame(frame)[2]) == (3, 2.5, 10.0, "Zoë 🦊")
    assert parse_frame(reply_frame("client-7", '{"ok":true}').encode()) == (
        "client-7",
        False,
        b'{"ok":true}',
    )


def test_a_parser_that_knows_only_outcomes_reads_a_progress_frame_as_a_call_nobody_waits_for() -> (
    None
):
    frame = progress_frame("client-7", encode_progress(1, 1, None, None)).encode()

    # What a client older than progress frames does: the call id is all before the newline.
    call_id = frame.partition(b"\n")[0].decode()

    assert call_id != "client-7" and call_id.startswith("client-7")


def test_a_long_message_is_cut_and_a_non_finite_number_is_refused() -> None:
    assert parse_progress(encode_progress(1, 0, None, "x" * 5000))[3] == "x" * PROGRESS_MESSAGE_MAX
    with pytest.raises(ValueError):
        encode_progress(1, math.nan, None, None)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[]",
        b'{"done": 1}',
        b'{"seq": "1", "done": 1, "total": null, "message": null}',
        b'{"seq": 1, "done": true, "total": null, "message": null}',
        b'{"seq": 1, "done": 1, "total": null, "message": 5}',
    ],
)
def test_a_body_that_is_not_a_progress_report_is_refused(body: bytes) -> None:
    with pytest.raises(ValueError, match="not a progress report"):
        parse_progress(body)


@pytest.mark.parametrize(
    ("done", "total", "message", "error"),
    [
        ("1", None, None, TypeError),
        (True, None, None, TypeError),
        (1, "2", None, TypeError),
        (1, None, 3, TypeError),
        (-1, None, None, ValueError),
        (math.inf, None, None, ValueError),
        (1, 0, None, ValueError),
        (1, math.nan, None, ValueError),
    ],
)
def test_report_progress_checks_its_arguments_even_outside_a_worker(
    done: object, total: object, message: object, error: type[Exception]
) -> None:
    with pytest.raises(error):
        report_progress(done, total, message)  # type: ignore[arg-type]


def frames(*reports: tuple[int, float]) -> list[bytes]:
    return [encode_progress(seq, done, 10, None).encode() for seq, done in reports]


def test_a_loop_sink_hands_events_over_in_order_once_each_and_nothing_after_it_closes() -> None:
    seen: list[ProgressEvent] = []

    async def scenario() -> None:
        sink = ProgressSink.for_loop(seen.append)
        # The reply thread: a frame read twice after a lost connection comes again.
        thread = threading.Thread(
            target=lambda: [sink.deliver(f) for f in frames((1, 1), (2, 4), (1, 1), (2, 4), (3, 9))]
        )
        thread.start()
        thread.join()
        await asyncio.sleep(0)  # the loop runs what the thread handed over
        await sink.aclose()
        sink.deliver(frames((4, 10))[0])
        await asyncio.sleep(0)

    asyncio.run(scenario())

    assert [event.done for event in seen] == [1, 4, 9]
    assert seen[-1].fraction == 0.9


def test_an_async_callback_is_awaited_one_event_after_the_other_before_close_returns() -> None:
    handled: list[float] = []

    async def slow(event: ProgressEvent) -> None:
        await asyncio.sleep(0.01 if event.done == 1 else 0)
        handled.append(event.done)

    async def scenario() -> None:
        sink = ProgressSink.for_loop(slow)
        for frame in frames((1, 1), (2, 2), (3, 3)):
            sink.deliver(frame)
        await asyncio.sleep(0)
        await sink.aclose()

    asyncio.run(scenario())

    assert handled == [1, 2, 3]


def test_a_thread_sink_runs_callbacks_on_the_progress_thread_and_close_waits_for_them() -> None:
    seen: list[tuple[float, str]] = []
    sink = ProgressSink.for_thread(lambda e: seen.append((e.done, threading.current_thread().name)))
    for frame in frames((1, 1), (2, 2)):
        sink.deliver(frame)

    sink.close()
    sink.deliver(frames((3, 3))[0])

    assert seen == [(1, "toolexec-progress-callbacks"), (2, "toolexec-progress-callbacks")]
