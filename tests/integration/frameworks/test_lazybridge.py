"""LazyBridge: one toolexec run per agent run, and LazyBridge's own timeout behaviours.

Every agent here is a real ``lazybridge.Agent`` driven by ``ScriptedProvider`` (a real
LazyBridge ``BaseProvider`` playing a script), so the tool results asserted are the
exact text the model would read. Remote tools run on the module's real worker.

The timeout suite runs each LazyBridge behaviour twice: with a local ``lazybridge.Tool``
(what LazyBridge itself does) and with the remote tool of the same name (what the
adapter must reproduce). Local and remote differ only in the tool-error text, where the
remote one names the remote exception type.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import lazybridge
import pytest
import redis
from lazybridge import Agent, Plan, Step, Tool

from agent_client import NOT_SET, ToolClient, current_run_id, remote_tool, remote_tools, run_scope
from agent_client.frameworks import lazybridge as adapter
from agent_client.testing import ScriptedProvider, scripted_agent
from tests.integration.deadlines import as_set
from tests.integration.polling import wait_until

Entry = Literal["call", "run", "stream"]
ENTRIES: tuple[Entry, ...] = ("call", "run", "stream")
Kind = Literal["local", "remote"]
KINDS: tuple[Kind, ...] = ("local", "remote")

#: How a test gets the idempotent counter into an agent: one proxy, or the catalogue.
PROVIDERS: dict[str, Callable[[], Any]] = {
    "remote_tool": lambda: remote_tool("idem_count"),
    "remote_tools": lambda: remote_tools(queues=["idem"]),
}


def drive(agent: Agent, entry: Entry, tasks: list[str]) -> list[str]:
    """Run ``agent`` once per task through ``entry``; the final texts.

    The async entries run every task in ONE asyncio task, one after the other, so a
    run id left behind by one run would leak into the next.
    """
    if entry == "call":
        return [agent(task).text() for task in tasks]

    async def main() -> list[str]:
        texts = []
        for task in tasks:
            if entry == "run":
                texts.append((await agent.run(task)).text())
            else:
                texts.append("".join([chunk async for chunk in agent.stream(task)]))
        return texts

    return asyncio.run(main())


def shown(provider: ScriptedProvider) -> list[str]:
    """The tool results the model read, in order."""
    return [str(result.content) for result in provider.tool_results()]


def counted(provider: ScriptedProvider) -> list[dict[str, Any]]:
    """The ``idem_count`` reports the model read, in order."""
    return [json.loads(text) for text in shown(provider)]


def executions(runs: tuple[str, redis.Redis]) -> int:
    """How many times ``idem_count`` ran under the test's counter."""
    counter, client = runs
    return int(client.get(counter) or 0)


# -- validation in the proxy -------------------------------------------------------------


@pytest.mark.parametrize("provider_kind", PROVIDERS)
def test_a_bad_call_is_refused_before_anything_is_sent_and_the_model_reads_which_field(
    provider_kind: str,
    framework_client: ToolClient,
    runs: tuple[str, redis.Redis],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[object] = []
    send = framework_client.publisher.send

    def recording(batch: list[Any]) -> None:
        sent.extend(batch)
        send(batch)

    monkeypatch.setattr(framework_client.publisher, "send", recording)
    counter = runs[0]
    provider = ScriptedProvider(
        [
            [("idem_count", {"counter": counter, "seconds": "long"})],
            [("idem_count", {"counter": counter})],  # the model fixes it
            "fixed",
        ]
    )
    agent = scripted_agent([PROVIDERS[provider_kind]()], provider)

    assert agent("count").text() == "fixed"

    refused, accepted = provider.tool_results()
    assert refused.is_error and refused.content == (
        "Tool error: invalid arguments for tool 'idem_count': seconds: 'long' is not of type "
        "'number'"
    )
    assert json.loads(str(accepted.content))["runs"] == 1
    assert len(sent) == 1  # the fixed call only: the refused one never reached the broker
    assert executions(runs) == 1


# -- one toolexec run per agent run ---------------------------------------------------


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("provider_kind", PROVIDERS)
def test_repeats_within_one_agent_run_share_one_execution_and_the_next_run_is_another(
    entry: Entry,
    provider_kind: str,
    framework_client: ToolClient,
    runs: tuple[str, redis.Redis],
) -> None:
    call = ("idem_count", {"counter": runs[0]})
    provider = ScriptedProvider([[call, call], [call], "first", [call], "second"])
    agent = scripted_agent([PROVIDERS[provider_kind]()], provider)

    texts = drive(agent, entry, ["book it", "book it again"])

    assert texts == ["first", "second"]
    same_turn_a, same_turn_b, later_turn, next_run = counted(provider)
    for repeat in (same_turn_b, later_turn):
        assert repeat["token"] == same_turn_a["token"]
        assert repeat["run_id"] == same_turn_a["run_id"]
    assert same_turn_a["runs"] == 1
    assert next_run["runs"] == 2
    assert next_run["token"] != same_turn_a["token"]
    assert next_run["run_id"] != same_turn_a["run_id"]
    assert executions(runs) == 2
    assert current_run_id() is None  # nothing left open in the caller


@pytest.mark.parametrize("entry", ENTRIES)
def test_an_enclosing_run_scope_wins_so_two_agent_runs_inside_it_share_one_run(
    entry: Entry, framework_client: ToolClient, runs: tuple[str, redis.Redis]
) -> None:
    call = ("idem_count", {"counter": runs[0]})
    provider = ScriptedProvider([[call], "first", [call], "second"])
    agent = scripted_agent([remote_tool("idem_count")], provider)

    with run_scope() as run_id:
        drive(agent, entry, ["book it", "book it again"])

    first, second = counted(provider)
    assert first["run_id"] == second["run_id"] == run_id
    assert second["token"] == first["token"]
    assert executions(runs) == 1


def two_counting_agents(
    provider_kind: str, runs: tuple[str, redis.Redis]
) -> tuple[list[Agent], list[ScriptedProvider]]:
    """Two agents sharing one proxy, each scripted to count once, slowly enough to overlap."""
    tools = PROVIDERS[provider_kind]()
    call = ("idem_count", {"counter": runs[0], "seconds": 0.3})
    providers = [ScriptedProvider([[call], "done"]) for _ in range(2)]
    return [scripted_agent([tools], p) for p in providers], providers


def assert_two_runs(providers: list[ScriptedProvider], runs: tuple[str, redis.Redis]) -> None:
    (a,), (b,) = (counted(p) for p in providers)
    assert a["run_id"] != b["run_id"]
    assert a["token"] != b["token"]
    assert executions(runs) == 2


@pytest.mark.parametrize("provider_kind", PROVIDERS)
def test_concurrent_agent_runs_in_two_asyncio_tasks_are_two_runs(
    provider_kind: str, framework_client: ToolClient, runs: tuple[str, redis.Redis]
) -> None:
    (first, second), providers = two_counting_agents(provider_kind, runs)

    async def both() -> None:
        await asyncio.gather(first.run("book"), second.run("book"))

    asyncio.run(both())

    assert_two_runs(providers, runs)


@pytest.mark.parametrize("provider_kind", PROVIDERS)
def test_concurrent_agent_runs_in_two_threads_are_two_runs(
    provider_kind: str, framework_client: ToolClient, runs: tuple[str, redis.Redis]
) -> None:
    agents, providers = two_counting_agents(provider_kind, runs)

    with ThreadPoolExecutor(max_workers=2) as pool:
        texts = list(pool.map(lambda agent: agent("book").text(), agents))

    assert texts == ["done", "done"]
    assert_two_runs(providers, runs)


# -- composite agents: one run spans everything a top-level run runs -----------------------


def counting_agents(
    runs: tuple[str, redis.Redis], *, times: int
) -> tuple[list[Agent], list[ScriptedProvider]]:
    """Two agents with the idempotent counter, each scripted to count once per run,
    ``times`` runs."""
    call = ("idem_count", {"counter": runs[0], "seconds": 0.3})
    providers = [ScriptedProvider([[call], "done"] * times) for _ in range(2)]
    agents = [
        scripted_agent([remote_tool("idem_count")], provider, name=f"agent{i}")
        for i, provider in enumerate(providers)
    ]
    return agents, providers


def assert_one_execution_per_top_level_run(
    providers: list[ScriptedProvider], runs: tuple[str, redis.Redis]
) -> None:
    """Each agent counted once per top-level run; the agents shared each run's execution."""
    (a_first, a_second), (b_first, b_second) = (counted(p) for p in providers)
    assert a_first["token"] == b_first["token"] and a_first["run_id"] == b_first["run_id"]
    assert a_second["token"] == b_second["token"] and a_second["run_id"] == b_second["run_id"]
    assert a_second["run_id"] != a_first["run_id"]
    assert executions(runs) == 2
    assert current_run_id() is None


@pytest.mark.parametrize("entry", ["call", "run"])
def test_a_parallel_fan_out_is_one_run_so_its_concurrent_branches_share_one_execution(
    entry: str, framework_client: ToolClient, runs: tuple[str, redis.Redis]
) -> None:
    agents, providers = counting_agents(runs, times=2)
    fan_out = Agent.parallel(*agents)

    for _ in range(2):
        envelope = fan_out("book") if entry == "call" else asyncio.run(fan_out.run("book"))
        assert envelope.error is None and envelope.text() == "[agent0]\ndone\n\n[agent1]\ndone"

    assert_one_execution_per_top_level_run(providers, runs)


def test_a_chain_is_one_run_so_its_steps_share_one_execution(
    framework_client: ToolClient, runs: tuple[str, redis.Redis]
) -> None:
    agents, providers = counting_agents(runs, times=2)
    chain = Agent.chain(*agents)

    assert [chain("book").text() for _ in range(2)] == ["done", "done"]

    assert_one_execution_per_top_level_run(providers, runs)


def test_each_input_of_a_plan_run_many_is_one_run_for_all_its_steps(
    framework_client: ToolClient, runs: tuple[str, redis.Redis]
) -> None:
    agents, providers = counting_agents(runs, times=2)
    plan = Plan(*(Step(target=agent, name=agent.name) for agent in agents))

    envelopes = plan.run_many(["book", "book again"], concurrency=1)  # one input after the other

    assert [e.text() for e in envelopes] == ["done", "done"]
    assert_one_execution_per_top_level_run(providers, runs)


# -- the private LazyBridge seams the adapter relies on, pinned ------------------------


@pytest.mark.parametrize("entry", ENTRIES)
def test_each_agent_entry_point_opens_one_run_that_its_tools_and_sub_agents_see(
    entry: Entry,
) -> None:
    # Pins the wrapped entry points: agent(...) must still reach Agent.run, and tool
    # calls (also a sub-agent's) must still run in the context of the agent's run.
    seen: list[str | None] = []

    async def whoami() -> str:
        """Report the toolexec run this call belongs to."""
        seen.append(current_run_id())
        return "ok"

    local = Tool(whoami, name="whoami")
    helper = scripted_agent([local], [[("whoami", {})], "helped"], name="helper")
    main = [[("whoami", {}), ("helper", {"task": "help"})], "first", [("whoami", {})], "second"]
    agent = scripted_agent([local, helper], main)
    between_chunks: list[str | None] = []

    if entry == "stream":

        async def consume() -> None:
            for task in ("one", "two"):
                async for _ in agent.stream(task):
                    between_chunks.append(current_run_id())

        asyncio.run(consume())
    else:
        drive(agent, entry, ["one", "two"])

    first_run, first_run_nested, second_run = seen  # the first two in either order
    assert first_run is not None and second_run is not None
    assert first_run_nested == first_run  # the sub-agent runs inside its caller's run
    assert second_run != first_run
    # One chunk per run (its final text); the consumer's code runs outside the run.
    assert between_chunks == ([None, None] if entry == "stream" else [])
    assert current_run_id() is None


def test_agent_runs_are_wrapped_once_however_often_the_adapter_asks() -> None:
    wrapped = [(Agent, "stream"), *adapter.SCOPED_RUNS]
    before = [getattr(owner, name) for owner, name in wrapped]

    adapter.scope_agent_runs()

    assert [getattr(owner, name) for owner, name in wrapped] == before
    for (owner, name), method in zip(wrapped, before, strict=True):
        original = getattr(method, "__wrapped__")  # noqa: B009 - set by functools.wraps
        assert not hasattr(original, "__wrapped__")  # one layer: LazyBridge's own method
        assert original.__module__ == owner.__module__ and original.__name__ == name


def test_a_parallel_agents_entry_points_reach_its_wrapped_run_branches() -> None:
    # Pins ParallelAgent: run() and __call__ (and so as_tool) go through run_branches,
    # and each branch runs in the context it was started from.
    seen: list[str | None] = []

    async def whoami() -> str:
        """Report the toolexec run this call belongs to."""
        seen.append(current_run_id())
        return "ok"

    branches = [
        scripted_agent([Tool(whoami, name="whoami")], [[("whoami", {})], "done"] * 2, name=f"b{i}")
        for i in range(2)
    ]
    fan_out = Agent.parallel(*branches)

    fan_out("one")
    asyncio.run(fan_out.run("two"))

    first_a, first_b, second_a, second_b = seen
    assert first_a == first_b is not None and second_a == second_b is not None
    assert first_a != second_a


def test_lazybridge_hands_the_effective_limit_to_tool_dispatch() -> None:
    # The adapter reads the agent's tool_timeout from Tool._dispatch's second argument.
    limits: list[float | None] = []

    class Recording(Tool):
        async def _dispatch(self, kwargs: dict[str, Any], timeout: float | None) -> Any:
            limits.append(timeout)
            return await super()._dispatch(kwargs, timeout)

    async def ping() -> str:
        """Answer."""
        return "pong"

    for own in (None, 0.7):
        tool = Recording(ping, name="ping", timeout=own)
        scripted_agent([tool], [[("ping", {})], "done"], tool_timeout=2.5)("go")

    assert limits == [2.5, 0.7]


@pytest.mark.parametrize("provider_kind", ["remote_tool", "remote_tools"])
def test_the_agents_tool_timeout_is_the_remote_calls_deadline(
    provider_kind: str, framework_client: ToolClient
) -> None:
    tools = remote_tool("call_context") if provider_kind == "remote_tool" else remote_tools()
    provider = ScriptedProvider([[("call_context", {})], "done"])

    scripted_agent([tools], provider, tool_timeout=4.0)("when")

    time_left = json.loads(shown(provider)[0])["time_left"]
    assert as_set(time_left, 4.0)  # not the settings default


#: level -> (the tools, Agent keywords, LLMEngine keywords, the deadline the worker sees).
DEADLINES: dict[str, tuple[Callable[[], Any], dict[str, Any], dict[str, Any], float]] = {
    "the tool's own @tool(timeout=)": (lambda: remote_tool("own_deadline"), {}, {}, 7.0),
    "remote_tools(default_timeout=) over the tool's own": (
        lambda: remote_tools(default_timeout=9.0),
        {},
        {},
        9.0,
    ),
    "LLMEngine(tool_timeout=) with a single proxy": (
        lambda: remote_tool("own_deadline"),
        {},
        {"tool_timeout": 4.0},
        4.0,
    ),
    "LLMEngine(tool_timeout=) over remote_tools(default_timeout=)": (
        lambda: remote_tools(default_timeout=9.0),
        {},
        {"tool_timeout": 4.0},
        4.0,
    ),
    "Agent(tool_timeout=) over LLMEngine(tool_timeout=)": (
        lambda: remote_tool("own_deadline"),
        {"tool_timeout": 3.0},
        {"tool_timeout": 5.0},
        3.0,
    ),
    "Agent(tool_timeout=) over a shorter remote_tools(default_timeout=)": (
        lambda: remote_tools(default_timeout=4.0),
        {"tool_timeout": 9.0},
        {},
        9.0,
    ),
    "remote_tool(timeout=) over Agent(tool_timeout=)": (
        lambda: remote_tool("own_deadline", timeout=9.0),
        {"tool_timeout": 4.0},
        {},
        9.0,
    ),
}


@pytest.mark.parametrize("level", list(DEADLINES))
def test_the_remote_deadline_is_the_highest_level_set(
    level: str, framework_client: ToolClient
) -> None:
    tools, agent_options, engine_options, limit = DEADLINES[level]
    provider = ScriptedProvider([[("own_deadline", {})], "done"])

    scripted_agent([tools()], provider, engine_options=engine_options, **agent_options)("when")

    time_left = json.loads(shown(provider)[0])["time_left"]
    assert as_set(time_left, limit)


# -- LazyBridge's own timeout behaviours, for a local and a remote tool -----------------


class ProbeFailure(Exception):
    """What the local ``probe_fail`` raises, like the remote probe."""


async def local_probe_sleep(seconds: float) -> str:
    """Sleep for `seconds`."""
    await asyncio.sleep(seconds)
    return json.dumps({"slept": seconds})


def local_probe_fail(message: str) -> None:
    """Raise ProbeFailure(`message`)."""
    raise ProbeFailure(message)


async def local_raises_timeout() -> None:
    """Fail as an HTTP client whose own deadline passed does."""
    raise TimeoutError("upstream took too long")


LOCAL_TOOLS: dict[str, Callable[..., Any]] = {
    "probe_sleep": local_probe_sleep,
    "probe_fail": local_probe_fail,
    "raises_timeout": local_raises_timeout,
}

TOOL_TIMEOUT = "[TOOL_TIMEOUT] Tool 'probe_sleep' timed out after 0.3s"
FAILURE = {
    "local": "Tool error: boom",
    "remote": "Tool error: tool 'probe_fail' failed: ProbeFailure: boom",
}
OWN_TIMEOUT_ERROR = {
    "local": "Tool error: upstream took too long",
    "remote": "Tool error: tool 'raises_timeout' failed: TimeoutError: upstream took too long",
}


def make_tool(kind: Kind, name: str, own_timeout: float | None = None) -> Any:
    """The local Tool or the remote proxy named ``name``, with its own bound if given."""
    if kind == "local":
        return Tool(LOCAL_TOOLS[name], name=name, timeout=own_timeout)
    return remote_tool(name, timeout=NOT_SET if own_timeout is None else own_timeout)


@pytest.fixture
def warm(framework_client: ToolClient) -> ToolClient:
    """The client after one call, so its reply listener already runs before a count."""
    remote_tool("probe_echo")(text="warm", number=1)
    return framework_client


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("kind", KINDS)
def test_a_tool_past_its_bound_shows_the_model_tool_timeout_and_the_run_goes_on(
    kind: Kind, entry: Entry, warm: ToolClient
) -> None:
    provider = ScriptedProvider([[("probe_sleep", {"seconds": 2})], "carried on"])
    agent = scripted_agent([make_tool(kind, "probe_sleep")], provider, tool_timeout=0.3)
    threads = threading.active_count()

    started = time.monotonic()
    texts = drive(agent, entry, ["report"])
    elapsed = time.monotonic() - started

    assert texts == ["carried on"]
    (result,) = provider.tool_results()
    assert result.content == TOOL_TIMEOUT
    assert result.is_error
    assert elapsed < 2.0  # answered before the 2 s tool could have finished
    assert wait_until(lambda: threading.active_count() <= threads, timeout=5)


@pytest.mark.parametrize("kind", KINDS)
def test_an_exception_is_a_tool_error_the_model_reads_and_the_run_goes_on(
    kind: Kind, framework_client: ToolClient
) -> None:
    provider = ScriptedProvider([[("probe_fail", {"message": "boom"})], "carried on"])
    agent = scripted_agent([make_tool(kind, "probe_fail")], provider, tool_timeout=5)

    envelope = agent("fail")

    assert envelope.text() == "carried on"
    (result,) = provider.tool_results()
    assert result.content == FAILURE[kind]
    assert result.is_error


@pytest.mark.parametrize("kind", KINDS)
def test_a_tools_own_timeout_error_is_a_tool_error_not_a_tool_timeout(
    kind: Kind, framework_client: ToolClient
) -> None:
    provider = ScriptedProvider([[("raises_timeout", {})], "carried on"])
    agent = scripted_agent([make_tool(kind, "raises_timeout")], provider, tool_timeout=5)

    envelope = agent("fetch")

    assert envelope.text() == "carried on"
    (result,) = provider.tool_results()
    assert result.content == OWN_TIMEOUT_ERROR[kind]
    assert result.is_error


@pytest.mark.parametrize("kind", KINDS)
def test_the_tools_own_shorter_bound_wins_over_the_agents_tool_timeout(
    kind: Kind, framework_client: ToolClient
) -> None:
    provider = ScriptedProvider([[("probe_sleep", {"seconds": 2})], "carried on"])
    tool = make_tool(kind, "probe_sleep", own_timeout=0.3)
    agent = scripted_agent([tool], provider, tool_timeout=30)

    started = time.monotonic()
    agent("report")

    assert shown(provider) == [TOOL_TIMEOUT]
    assert time.monotonic() - started < 2.0  # not the agent's 30 s, nor the 2 s tool


@pytest.mark.parametrize("kind", KINDS)
def test_the_tools_own_longer_bound_wins_over_the_agents_tool_timeout(
    kind: Kind, framework_client: ToolClient
) -> None:
    provider = ScriptedProvider([[("probe_sleep", {"seconds": 0.6})], "done"])
    tool = make_tool(kind, "probe_sleep", own_timeout=10)
    agent = scripted_agent([tool], provider, tool_timeout=0.2)

    agent("report")

    assert json.loads(shown(provider)[0])["slept"] == 0.6


def attributes(tool: Any) -> dict[str, Any]:
    """A shallow copy of ``tool``'s attributes (a local Tool's schema built first)."""
    if isinstance(tool, Tool):
        tool.definition()  # cached on first use; not what this test is about
    return dict(vars(tool))


@pytest.mark.parametrize("kind", KINDS)
def test_a_tool_shared_by_agents_with_different_tool_timeouts_is_not_changed(
    kind: Kind, framework_client: ToolClient
) -> None:
    shared = make_tool(kind, "probe_sleep")
    before = attributes(shared)
    hasty = ScriptedProvider([[("probe_sleep", {"seconds": 2})], "gave up"])
    patient = ScriptedProvider([[("probe_sleep", {"seconds": 0.6})], "waited"])
    hasty_agent = scripted_agent([shared], hasty, tool_timeout=0.3)
    patient_agent = scripted_agent([shared], patient, tool_timeout=10)

    hasty_agent("report")
    patient_agent("report")

    assert shown(hasty) == [TOOL_TIMEOUT]
    assert json.loads(shown(patient)[0])["slept"] == 0.6
    assert attributes(shared) == before
    if kind == "local":
        assert shared.timeout is None  # each agent bounded its own copy
    else:
        assert shared.proxy_timeout is NOT_SET


@pytest.mark.parametrize("kind", KINDS)
def test_run_sync_honours_the_tools_own_bound(kind: Kind, framework_client: ToolClient) -> None:
    tool = make_tool(kind, "probe_sleep", own_timeout=0.3)
    (lazybridge_tool,) = [tool] if kind == "local" else tool.as_tools()

    started = time.monotonic()
    with pytest.raises(lazybridge.ToolTimeoutError) as raised:
        lazybridge_tool.run_sync(seconds=2)

    assert str(raised.value) == "Tool 'probe_sleep' timed out after 0.3s"
    assert raised.value.timeout == 0.3
    assert time.monotonic() - started < 2.0  # before the 2 s tool could have finished


# -- approval, as LazyBridge asks for it: the engine's approval gate ---------------------------


@pytest.mark.parametrize(
    ("decision", "ran"),
    [(lazybridge.ApprovalDecision.allow(), 1), (lazybridge.ApprovalDecision.deny("not today"), 0)],
    ids=["allowed", "denied"],
)
def test_the_engines_gate_is_asked_first_and_a_denied_call_never_reaches_a_worker(
    decision: lazybridge.ApprovalDecision,
    ran: int,
    framework_client: ToolClient,
    runs: tuple[str, redis.Redis],
) -> None:
    asked: list[tuple[str, dict[str, Any]]] = []

    def gate(request: lazybridge.ApprovalRequest) -> lazybridge.ApprovalDecision:
        asked.append((request.name, dict(request.arguments)))
        return decision

    provider = ScriptedProvider([[("approved_count", {"counter": runs[0]})], "done"])
    agent = scripted_agent(
        [remote_tool("approved_count")], provider, engine_options={"approval_gate": gate}
    )

    assert agent("go").text() == "done"

    assert asked == [("approved_count", {"counter": runs[0]})]
    assert executions(runs) == ran
    (result,) = shown(provider)
    assert result == ('{"runs": 1}' if ran else "Tool error: not today")


def test_without_a_gate_a_tool_that_requires_approval_is_refused_and_nothing_is_sent(
    framework_client: ToolClient, runs: tuple[str, redis.Redis]
) -> None:
    counter = runs[0]
    refused = ScriptedProvider([[("approved_count", {"counter": counter})], "done"])
    trusted = ScriptedProvider([[("approved_count", {"counter": counter})], "done"])

    scripted_agent([remote_tool("approved_count")], refused)("go")
    scripted_agent([remote_tools(requires_approval=False)], trusted)("go")

    (text,) = shown(refused)
    assert text.startswith(
        "Tool error: tool 'approved_count' requires approval, and no approval gate was asked"
    )
    assert shown(trusted) == ['{"runs": 1}']  # the toolset's override: no approval needed
    assert executions(runs) == 1
