"""executor.task.run_call_async for a ``def`` tool, called directly on a loop set up as the
asyncio pool sets up its own: the pool's tool threads as the loop's default executor and
its I/O lanes as the offload.

A ``def`` tool's outcome leaves from the thread that ran the tool while the pool runs no
other call (no hand-back to the loop, no hop to a delivery thread); a plain call that ends
beside others goes back to the loop and shares the delivery lane's pipeline; a keyed call
is concluded where it ran; a call the pool gives up before a thread takes it never runs,
and its key is let go.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

import executor.task
from executor import cancel_state
from executor.pools.offload import IOLanes
from executor.task import run_call_async
from wire import keys
from wire.models import CallOutcome, CallRequest, ErrorKind
from wire.settings import Settings

from .conftest import Register
from .support import make_call, next_reply, unique

WORKER = "direct@host"

Run = Callable[[CallRequest, int], tuple[CallOutcome | None, dict[str, list[str]]]]


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """The threads that ran each delivery step: ``conclude`` (one call, where it ran) and
    ``_conclude_plain`` (the delivery lane's pipeline). Each still does its work."""
    threads: dict[str, list[str]] = {"conclude": [], "_conclude_plain": []}
    for name in threads:
        real = getattr(executor.task, name)

        def spy(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            threads[_name].append(threading.current_thread().name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(executor.task, name, spy)
    return threads


@pytest.fixture
def run(settings: Settings, seen: dict[str, list[str]]) -> Iterator[Run]:
    """Run one call on a fresh loop, as the pool would with ``calls`` calls on it."""

    def _run(call: CallRequest, calls: int) -> tuple[CallOutcome | None, dict[str, list[str]]]:
        async def main() -> CallOutcome | None:
            loop = asyncio.get_running_loop()
            tools = ThreadPoolExecutor(2, thread_name_prefix="toolexec-tool")
            loop.set_default_executor(tools)
            lanes = IOLanes(1, calls=lambda: calls)
            lanes.start(loop)
            try:
                return await run_call_async(
                    call.model_dump(mode="json"), settings=settings, worker=WORKER, offload=lanes
                )
            finally:
                await asyncio.to_thread(lanes.stop)

        return asyncio.run(main()), seen

    yield _run


def test_a_def_tool_alone_on_the_pool_delivers_from_the_thread_that_ran_it(
    client: redis.Redis, register: Register, run: Run
) -> None:
    ran_in: list[str] = []
    call = make_call(
        register(lambda: ran_in.append(threading.current_thread().name) or "done", description=".")
    )

    outcome, seen = run(call, 1)

    assert outcome is not None and outcome.ok and outcome.result == "done"
    assert next_reply(client, call.reply_to) == (call.call_id, outcome)
    assert len(ran_in) == 1 and ran_in[0].startswith("toolexec-tool")
    assert seen == {"conclude": ran_in, "_conclude_plain": []}


def test_a_plain_call_ending_beside_others_shares_the_delivery_lane(
    client: redis.Redis, register: Register, run: Run
) -> None:
    call = make_call(register(lambda: 7, description="."))

    outcome, seen = run(call, 3)

    assert outcome is not None and outcome.result == 7
    assert next_reply(client, call.reply_to) == (call.call_id, outcome)
    assert seen["conclude"] == []
    assert [name.startswith("toolexec-deliver") for name in seen["_conclude_plain"]] == [True]


def test_a_keyed_call_is_concluded_and_stored_where_it_ran_beside_others(
    client: redis.Redis, register: Register, run: Run
) -> None:
    ran_in: list[str] = []
    name = register(
        lambda: ran_in.append(threading.current_thread().name) or "booked",
        description=".",
        idempotent=True,
    )
    key = unique("key")
    first = make_call(name, idempotency_key=key)

    outcome, seen = run(first, 5)
    repeat, _ = run(make_call(name, idempotency_key=key), 5)

    assert outcome is not None and outcome.result == "booked"
    assert next_reply(client, first.reply_to) == (first.call_id, outcome)
    assert seen["conclude"] == ran_in and seen["_conclude_plain"] == []
    assert repeat is not None and repeat.result == "booked"
    assert len(ran_in) == 1  # the repeat was answered from the stored outcome


def test_a_call_given_up_before_a_thread_takes_it_never_runs_and_lets_its_key_go(
    client: redis.Redis, register: Register, settings: Settings
) -> None:
    runs: list[str] = []
    name = register(lambda: runs.append("ran") or "booked", description=".", idempotent=True)
    key = unique("key")
    tools = _OneToolThread()

    async def main() -> CallOutcome | None:
        loop = asyncio.get_running_loop()
        lanes = IOLanes(1, calls=lambda: 1)
        lanes.start(loop)

        def deliver(call: CallRequest) -> asyncio.Task[CallOutcome | None]:
            fields = call.model_dump(mode="json")
            return asyncio.create_task(
                run_call_async(fields, settings=settings, worker=WORKER, offload=lanes)
            )

        try:
            await tools.take()
            given_up = deliver(make_call(name, idempotency_key=key))
            await _until(tools.queued)  # admitted: it waits for the thread
            assert client.exists(keys.state(key))
            given_up.cancel()
            with pytest.raises(asyncio.CancelledError):
                await given_up
            await tools.give_back()
            # Its key was let go in this process: a new delivery of the key begins and
            # runs it, where a key still held here would make it join and wait.
            return await asyncio.wait_for(deliver(make_call(name, idempotency_key=key)), 10)
        finally:
            tools.let_go()
            lanes.stop()

    outcome = asyncio.run(main())

    assert outcome is not None and outcome.result == "booked"
    assert runs == ["ran"]  # the given-up delivery never ran the tool


class _OneToolThread(ThreadPoolExecutor):
    """The pool's tool threads cut to one, which a blocker takes until it is given back;
    ``queued`` tells when a step is handed to them."""

    def __init__(self) -> None:
        super().__init__(1, thread_name_prefix="toolexec-tool")
        self.queued = threading.Event()
        self._busy, self._release = threading.Event(), threading.Event()
        self._blocker: asyncio.Future[None] | None = None

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.queued.set()
        return super().submit(fn, *args, **kwargs)

    async def take(self) -> None:
        """Be the running loop's default executor, and have the blocker take the thread."""
        loop = asyncio.get_running_loop()
        loop.set_default_executor(self)
        self._blocker = loop.run_in_executor(None, self._block)
        await _until(self._busy)
        self.queued.clear()

    async def give_back(self) -> None:
        """Let the blocker end, and wait until it has."""
        self.let_go()
        assert self._blocker is not None
        await self._blocker

    def let_go(self) -> None:
        """Let the blocker end (its thread is then free)."""
        self._release.set()

    def _block(self) -> None:
        self._busy.set()
        self._release.wait(10)


async def _until(event: threading.Event, timeout: float = 10.0) -> None:
    """Wait on the loop until ``event`` is set (the loop's one tool thread is taken)."""
    async with asyncio.timeout(timeout):
        while not event.is_set():
            await asyncio.sleep(0.001)


def test_a_call_cancelled_while_it_waits_for_a_thread_is_answered_cancelled_and_never_starts(
    client: redis.Redis, register: Register, settings: Settings
) -> None:
    runs: list[str] = []
    call = make_call(register(lambda: runs.append("ran"), description="."))
    tools = _OneToolThread()

    async def main() -> CallOutcome | None:
        lanes = IOLanes(1, calls=lambda: 2)
        lanes.start(asyncio.get_running_loop())
        try:
            await tools.take()
            waiting = asyncio.create_task(
                run_call_async(
                    call.model_dump(mode="json"), settings=settings, worker=WORKER, offload=lanes
                )
            )
            await _until(tools.queued)  # admitted: it waits for the thread
            cancel_state.hear(call.call_id)  # a cancel reaches the worker meanwhile
            await tools.give_back()
            return await asyncio.wait_for(waiting, 10)
        finally:
            tools.let_go()
            lanes.stop()

    outcome = asyncio.run(main())

    assert outcome is not None and outcome.error is not None
    assert outcome.error.kind is ErrorKind.CANCELLED
    assert outcome.error.message.endswith("cancelled before it started")
    assert next_reply(client, call.reply_to) == (call.call_id, outcome)
    assert runs == []
