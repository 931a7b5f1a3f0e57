"""Offline LazyBridge agents for tests: a scripted model that calls tools on cue.

:class:`ScriptedProvider` is a real LazyBridge ``BaseProvider``. Instead of asking an
LLM, it plays a script: each turn either calls tools or answers with final text. It
records every request the agent sent it, so a test can read exactly which tool
results the model was shown::

    provider = ScriptedProvider([
        [("search", {"query": "celery"})],  # turn 0: call one tool
        "Celery is a task queue.",          # turn 1: answer
    ])
    agent = scripted_agent([search], provider, tool_timeout=5)  # any tools=[...] entry
    envelope = agent("What is Celery?")
    assert envelope.text() == "Celery is a task queue."
    print(provider.tool_results()[0].content)  # what the model read

Tool calls get deterministic ids, ``call_<turn>_<index>``, both counted from 0.

```
RuntimeError
└── ScriptExhausted    the agent asked for a turn the script does not have
```

This module imports LazyBridge at import time: it is the test helper of the
``lazybridge`` extra, and without it raises
:class:`~agent_client.frameworks.MissingExtra` naming the extra. Nothing else in
``agent_client`` imports LazyBridge until an adapter is asked for.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeAlias, cast

from agent_client.frameworks import require

require(
    "lazybridge", extra="lazybridge", framework="agent_client.testing (scripted LazyBridge agents)"
)

from lazybridge import Agent, BaseProvider, LLMEngine
from lazybridge.core.types import (
    CompletionRequest,
    CompletionResponse,
    Role,
    StreamChunk,
    ToolCall,
    ToolResultContent,
    UsageStats,
)

__all__ = [
    "ScriptExhausted",
    "ScriptTurn",
    "ScriptedCall",
    "ScriptedProvider",
    "scripted_agent",
]

#: One tool call in a script: the tool's name and its arguments.
ScriptedCall: TypeAlias = tuple[str, Mapping[str, Any]]
#: One model turn: final text, or the tool calls to make in that turn.
ScriptTurn: TypeAlias = str | Sequence[ScriptedCall]

# A turn as stored: the final text, or the calls as (name, arguments) pairs.
_Turn: TypeAlias = str | tuple[tuple[str, dict[str, Any]], ...]


class ScriptExhausted(RuntimeError):
    """The agent asked the model for another turn, but the script has none left.

    LazyBridge reports it as the run's error: the envelope's ``error.type`` is
    ``"ScriptExhausted"``.
    """


class ScriptedProvider(BaseProvider):
    """A LazyBridge provider that plays a fixed script instead of calling an LLM.

    Each request the agent sends consumes the next turn of the script. A turn that is
    a string ends the run with that text; a turn that is a list of
    ``(tool_name, arguments)`` pairs makes those tool calls, all in the same turn, so
    LazyBridge runs them concurrently. The script does not check names against the
    tools offered: scripting an unknown name shows what the model sees for one.

    Args:
        script: The turns, in order.
        model: The model name the provider reports.

    Raises:
        TypeError: A turn is neither text nor a list of ``(name, arguments)`` pairs.
        ValueError: The script, or a tool-call turn, is empty.
    """

    default_model = "scripted"
    supports_structured_output = False
    supports_thinking = False

    def __init__(self, script: Iterable[ScriptTurn], *, model: str = "scripted") -> None:
        self._turns = _read_script(script)
        self._requests: list[CompletionRequest] = []
        self._lock = threading.Lock()
        super().__init__(model=model)

    @property
    def requests(self) -> tuple[CompletionRequest, ...]:
        """Every request received, as it was when received (turn ``i`` is ``requests[i]``)."""
        with self._lock:
            return tuple(self._requests)

    @property
    def remaining(self) -> int:
        """How many turns of the script have not been played yet."""
        with self._lock:
            return max(0, len(self._turns) - len(self._requests))

    def tool_results(self) -> list[ToolResultContent]:
        """Every tool result the model was shown, in the order it was shown.

        Each result appears once: in the request that follows the turn whose call
        produced it. Its ``content`` is the exact text the model read, for example
        ``"Tool error: ..."`` or ``"[TOOL_TIMEOUT] ..."``.
        """
        shown: list[ToolResultContent] = []
        for request in self.requests:
            last = request.messages[-1] if request.messages else None
            if last is None or last.role != Role.USER or isinstance(last.content, str):
                continue
            shown.extend(block for block in last.content if isinstance(block, ToolResultContent))
        return shown

    def is_retryable(self, exc: BaseException) -> bool | None:
        # A retry would record a second request and play the next turn.
        return False

    def complete(self, request: CompletionRequest) -> CompletionResponse:
        """Record ``request`` and answer with the next turn of the script."""
        with self._lock:
            turn = len(self._requests)
            # The engine appends to one messages list across turns: copy it, or every
            # recorded request would show the final conversation.
            self._requests.append(dataclasses.replace(request, messages=list(request.messages)))
            if turn >= len(self._turns):
                raise ScriptExhausted(
                    f"ScriptedProvider was asked for turn {turn}, but the script has "
                    f"{len(self._turns)} turn(s); end it with a final text turn."
                )
            played = self._turns[turn]
        model = self._resolve_model(request)
        if isinstance(played, str):
            return CompletionResponse(
                content=played, stop_reason="end_turn", model=model, usage=UsageStats()
            )
        calls = [
            ToolCall(id=f"call_{turn}_{index}", name=name, arguments=dict(arguments))
            for index, (name, arguments) in enumerate(played)
        ]
        return CompletionResponse(
            content="", tool_calls=calls, stop_reason="tool_use", model=model, usage=UsageStats()
        )

    async def acomplete(self, request: CompletionRequest) -> CompletionResponse:
        """Async form of :meth:`complete`."""
        return self.complete(request)

    def stream(self, request: CompletionRequest) -> Iterator[StreamChunk]:
        """Play the next turn as a stream: its text in one chunk, then the final chunk."""
        yield from _as_chunks(self.complete(request))

    async def astream(self, request: CompletionRequest) -> AsyncIterator[StreamChunk]:
        """Async form of :meth:`stream`."""
        for chunk in _as_chunks(self.complete(request)):
            yield chunk


def scripted_agent(
    tools: Sequence[Any],
    script: ScriptedProvider | Iterable[ScriptTurn],
    *,
    engine_options: Mapping[str, Any] | None = None,
    **agent_kwargs: Any,
) -> Agent:
    """Build a real LazyBridge ``Agent`` whose model is a :class:`ScriptedProvider`.

    Args:
        tools: What ``Agent(tools=...)`` accepts: functions, ``Tool`` objects, tool
            providers such as ``remote_tool("search")``.
        script: A provider to drive the agent (keep a reference to read its requests
            afterwards), or the turns to build one from; it is then
            ``agent.engine.provider``.
        engine_options: Keyword arguments for ``LLMEngine``, for example
            ``{"tool_timeout": 2.0}`` or ``{"max_turns": 3}``.
        **agent_kwargs: Keyword arguments for ``Agent``, for example
            ``tool_timeout=2.0`` or ``name="researcher"``.

    Returns:
        The agent. Run it as usual: ``agent("task")`` or ``await agent.run("task")``.
    """
    provider = script if isinstance(script, ScriptedProvider) else ScriptedProvider(script)
    # LLMEngine annotates provider= as a name, but hands it to its Executor, which
    # takes a BaseProvider instance as it is.
    engine = LLMEngine(
        provider.model or "scripted", provider=cast(Any, provider), **dict(engine_options or {})
    )
    return Agent(engine=engine, tools=list(tools), **agent_kwargs)


def _read_script(script: Iterable[ScriptTurn]) -> tuple[_Turn, ...]:
    turns: list[_Turn] = []
    for number, turn in enumerate(script):
        if isinstance(turn, str):
            turns.append(turn)
            continue
        if not isinstance(turn, Sequence):
            raise TypeError(
                f"Script turn {number} is a {type(turn).__name__}; write final text as a "
                f'str, or tool calls as a list of (name, arguments) pairs: [("search", {{...}})].'
            )
        if not turn:
            raise ValueError(
                f"Script turn {number} makes no tool calls; write final text as a str instead."
            )
        turns.append(tuple(_read_call(number, call) for call in turn))
    if not turns:
        raise ValueError("The script is empty; give at least one turn, ending with final text.")
    return tuple(turns)


def _read_call(number: int, call: object) -> tuple[str, dict[str, Any]]:
    if (
        isinstance(call, tuple)
        and len(call) == 2
        and isinstance(call[0], str)
        and isinstance(call[1], Mapping)
    ):
        return call[0], dict(call[1])
    raise TypeError(
        f"Script turn {number} has the tool call {call!r}; write each call as a "
        f'(name, arguments) pair: ("search", {{"query": "x"}}).'
    )


def _as_chunks(response: CompletionResponse) -> Iterator[StreamChunk]:
    if response.content:
        yield StreamChunk(delta=response.content)
    yield StreamChunk(
        tool_calls=response.tool_calls,
        stop_reason=response.stop_reason,
        usage=response.usage,
        is_final=True,
    )
