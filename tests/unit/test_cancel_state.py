"""executor.cancel_state: each call's cancel in this process, below the runner."""

from __future__ import annotations

import asyncio
import uuid

from executor import cancel_state
from wire.models import CallRequest, ErrorKind


def call_id() -> str:
    return f"cancel-state-{uuid.uuid4().hex}"


def test_a_cancel_heard_while_a_call_runs_sets_its_event_and_starts_its_grace_once() -> None:
    graces: list[str] = []
    cid = call_id()

    with cancel_state.running(cid, lambda entry: graces.append(entry.call_id)) as entry:
        assert not cancel_state.requested(cid) and not entry.event.is_set()
        assert cancel_state.event_for(cid) is entry.event
        cancel_state.hear(cid)
        cancel_state.hear(cid)  # heard again (the listener read the set after a reconnect)

        assert cancel_state.requested(cid) and entry.event.is_set()
        assert graces == [cid]
    assert not cancel_state.requested(cid)  # it no longer runs here
    assert cancel_state.heard(cid)  # a copy of it that comes later never starts


def test_a_cancel_heard_before_the_call_runs_cancels_it_as_it_starts() -> None:
    graces: list[str] = []
    cid = call_id()
    cancel_state.hear(cid)

    with cancel_state.running(cid, lambda entry: graces.append(entry.call_id)) as entry:
        assert entry.event.is_set()
        assert graces == [cid]


def test_a_call_not_running_here_is_not_requested_and_gets_an_event_of_its_own() -> None:
    cid = call_id()

    assert not cancel_state.requested(cid)
    assert not cancel_state.heard(cid)
    assert not cancel_state.event_for(cid).is_set()


def test_the_answer_of_a_call_is_taken_once() -> None:
    cid = call_id()

    assert cancel_state.take_answer(cid)  # not running here: nothing else answers it
    with cancel_state.running(cid, lambda entry: None):
        assert cancel_state.take_answer(cid)
        assert not cancel_state.take_answer(cid)  # the grace answered it, or this delivery


def test_an_async_tools_task_is_cancelled_by_the_calls_cancel_before_or_after_it_is_bound() -> None:
    async def scenario() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        first, second = call_id(), call_id()
        with cancel_state.running(first, lambda entry: None):
            task = loop.create_task(asyncio.sleep(60))
            cancel_state.bind_task(first, task, loop)
            cancel_state.hear(first)
            await asyncio.sleep(0)  # the cancel is scheduled on the task's loop
            await asyncio.sleep(0)
            bound_before = task.cancelled()
        with cancel_state.running(second, lambda entry: None):
            cancel_state.hear(second)
            late = loop.create_task(asyncio.sleep(60))
            cancel_state.bind_task(second, late, loop)
            await asyncio.sleep(0)
            bound_after = late.cancelled()
        return bound_before, bound_after

    assert asyncio.run(scenario()) == (True, True)


def test_a_cancelled_outcome_names_the_tool_and_is_of_kind_cancelled() -> None:
    request = CallRequest(call_id=call_id(), tool="book", arguments={})

    outcome = cancel_state.cancelled_outcome(request, worker="w1")

    assert outcome.error is not None and outcome.error.kind is ErrorKind.CANCELLED
    assert outcome.error.type == "ToolCancelled"
    assert "'book' was cancelled" in outcome.error.message
