"""How a side of scenario 11 makes its calls: one at a time, and N in flight.

Every side, toolexec, raw Celery, a peer or the hand-written floor, is a :class:`Side`:
its label, its settings as the output states them, the PID of its worker (whose CPU
time is read with its children's) and its :class:`Calls`. An asyncio client keeps N
calls in flight with N coroutines (:func:`bench.stats.keep_in_flight`); a blocking one
with a window in one thread (:func:`bench.stats.keep_window`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from bench.stats import keep_in_flight, keep_window, timed, timed_async

__all__ = ["Calls", "Kind", "Side", "async_calls", "result_poll", "sync_calls"]

H = TypeVar("H")

#: What a side is: the goals compare toolexec with the peers, raw Celery and the floor.
Kind = Literal["toolexec", "raw", "peer", "floor"]

#: A poll interval never shorter than this, nor longer than this (taskiq's default).
_POLL_MIN = 0.001
_POLL_MAX = 0.2
#: Seconds of poll interval per call in flight: a quarter of a round trip at 1,000 calls/s.
_POLL_PER_CALL = 0.00025


@dataclass(frozen=True, kw_only=True)
class Calls:
    """How one side makes calls.

    Attributes:
        sequential: ``sequential(n)`` makes ``n`` calls one after the other and returns
            each one's seconds.
        block: ``block(in_flight, total)`` makes ``total`` calls with ``in_flight``
            outstanding and returns the seconds they took.
    """

    sequential: Callable[[int], list[float]]
    block: Callable[[int, int], float]


@dataclass(frozen=True, kw_only=True)
class Side:
    """One side of scenario 11.

    Attributes:
        label: Its name in the tables (``Dramatiq 2.2.1``).
        kind: toolexec, raw Celery, a peer or the floor.
        worker: Its worker processes and their settings, as the output states them.
        client: How its client calls and waits for results.
        pid: Its worker's main process; the CPU of its direct children counts too.
        calls: How it makes calls.
    """

    label: str
    kind: Kind
    worker: str
    client: str
    pid: int | None
    calls: Calls


def result_poll(in_flight: int) -> float:
    """Seconds between a polling client's reads of a call's result at ``in_flight``.

    arq's ``job.result(poll_delay=)`` and taskiq's ``wait_result(check_interval=)``
    poll (their defaults: 0.5 s and 0.2 s). A call's round trip grows with the calls in
    flight, and so does the interval: a quarter of the round trip at 1,000 calls/s, so
    that a call polls about five times and waits an eighth longer on average. That is
    0.25 ms per call in flight, at least 1 ms (1 to 4 in flight) and at most 0.2 s
    (800 in flight and more): 25 ms at 100, 0.2 s at 1,000.
    """
    return min(_POLL_MAX, max(_POLL_MIN, in_flight * _POLL_PER_CALL))


def async_calls(
    run: Callable[[Coroutine[Any, Any, Any]], Any],
    call_at: Callable[[int], Callable[[], Awaitable[object]]],
) -> Calls:
    """The calls of an asyncio client; ``call_at(in_flight)`` is its call at that level.

    ``run`` runs a coroutine to its end on the benchmark's one loop (``Bench.run``).
    """

    def sequential(n: int) -> list[float]:
        durations: list[float] = run(timed_async(call_at(1), n))
        return durations

    def block(in_flight: int, total: int) -> float:
        seconds: float = run(keep_in_flight(call_at(in_flight), in_flight, total))
        return seconds

    return Calls(sequential=sequential, block=block)


def sync_calls(send: Callable[[], H], wait: Callable[[H], object]) -> Calls:
    """The calls of a blocking client: ``send()`` starts one, ``wait(handle)`` ends it."""
    return Calls(
        sequential=lambda n: timed(lambda: wait(send()), n),
        block=lambda in_flight, total: keep_window(send, wait, in_flight, total),
    )
