"""What every test shares: the logging configuration one test must not leave to the next,
and the check that a test module leaves no client running and nothing unclosed."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import threading
import traceback
import tracemalloc
import warnings
from collections.abc import Iterator

import pytest

from agent_client._io.loop import THREAD_NAME

#: The root logger's level as the session starts, before any fixture changed it.
_ROOT_LEVEL = logging.getLogger().level

#: The modules that take longest (seconds summed over their tests, from a run's
#: ``--junitxml``), longest first. The suite runs whole modules in parallel processes
#: (``--dist loadscope``, pyproject.toml): started first, these do not end the run alone.
_LONGEST_FIRST = (
    "tests/integration/test_bench_smoke.py",
    "tests/unit/test_static_checks.py",
    "tests/integration/frameworks/test_oldest_versions.py",
    "tests/integration/test_deploy_warm.py",
    "tests/integration/test_outage_memory.py",
    "tests/integration/test_connection_drops.py",
    "tests/integration/test_deploy_cold.py",
    "tests/integration/test_task_events.py",
    "tests/integration/test_cancel.py",
    "tests/integration/test_handles.py",
    "tests/integration/test_retries.py",
    "tests/integration/test_amqp_faults.py",
    "tests/integration/test_lost_processes.py",
    "tests/integration/test_stalls_and_dead_callers.py",
    "tests/integration/test_leaks.py",
    "tests/integration/test_redis_outage.py",
    "tests/integration/test_idempotency.py",
    "tests/integration/test_brokers.py",
    "tests/integration/test_lost_windows.py",
    "tests/integration/test_redelivery.py",
    "tests/integration/test_asyncio_pool.py",
    "tests/integration/test_pools.py",
    "tests/integration/test_cli.py",
    "tests/integration/frameworks/test_mcp.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order modules longest first: the known long ones, then integration, contract,
    worker and unit tests; a module's own tests keep their order."""
    rank = {path: i for i, path in enumerate(_LONGEST_FIRST)}
    kinds = ("tests/integration/", "tests/contract/", "tests/worker/", "tests/unit/")

    def weight(item: pytest.Item) -> tuple[int, int]:
        path = item.nodeid.split("::", 1)[0]
        if path in rank:
            return (0, rank[path])
        kind = next((i for i, prefix in enumerate(kinds) if path.startswith(prefix)), len(kinds))
        return (1 + kind, 0)

    items.sort(key=weight)  # stable: collection order within each weight


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses connections for the whole test: bound by this
    process and never listened on. (A port merely free when asked may be taken meanwhile
    by another test process's server, and then answers.)"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


@pytest.fixture(autouse=True)
def _root_logger_level_restored() -> Iterator[None]:
    """Run each test with the root logger at the session's starting level.

    Starting pytest-celery's in-process worker (a session fixture, set up before this
    one) sets it to the worker's level (ERROR), and the rest of the session would then
    capture no warning at all: a test that looks for the client's warnings in
    ``caplog`` would see an empty log.
    """
    root = logging.getLogger()
    root.setLevel(_ROOT_LEVEL)
    yield
    root.setLevel(_ROOT_LEVEL)


@pytest.fixture(autouse=True, scope="module")
def _nothing_left_unclosed() -> Iterator[None]:
    """Fail the module that left a client running, or anything open to the collector.

    A client's I/O thread still running after the module's own fixtures closed theirs
    belongs to a client nobody closed (``ToolClient.close``). And Python warns
    (``ResourceWarning``) when the garbage collector finds a socket, a transport or an
    event loop still open, from ``__del__``, whenever a collection happens to run: on
    some later test, where ``filterwarnings = error`` would blame the wrong one.
    Collecting here names the module that leaked; with ``PYTHONTRACEMALLOC=20`` the
    failure shows where each object was made.
    """
    before = set(_io_threads())
    yield
    for thread in _io_threads():
        if thread not in before:
            thread.join(5.0)  # a client closed under load may still be closing its loop
    running = [thread for thread in _io_threads() if thread not in before]
    if running:
        pytest.fail(
            f"{len(running)} agent client(s) left running: close every ToolClient the module made",
            pytrace=False,
        )
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()
        gc.collect()  # what the first collection's finalizers let go
    leaks = [warning for warning in seen if issubclass(warning.category, ResourceWarning)]
    if leaks:
        pytest.fail(
            "left to the garbage collector:\n" + "\n".join(_describe(w) for w in leaks),
            pytrace=False,
        )


def _io_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == THREAD_NAME]


def _describe(warning: warnings.WarningMessage) -> str:
    made = tracemalloc.get_object_traceback(warning.source) if warning.source is not None else None
    where = (
        "\n".join(made.format())
        if made is not None
        else "  (set PYTHONTRACEMALLOC=20 to see where it was made)"
    )
    origin = getattr(warning.source, _ORIGIN, None)
    if isinstance(origin, str):  # an event loop: made where its policy saw it made
        where = "  made at:\n" + origin
    return f"- {warning.message}\n{where}"


#: The attribute naming where an event loop of this process was made.
_ORIGIN = "_made_at_in_tests"


class _LoopsKnowWhereTheyWereMade(asyncio.DefaultEventLoopPolicy):
    """Every event loop made in the test process remembers the stack that made it.

    A loop left unclosed is only found when the collector frees it, often in a later
    module; its stack names its owner there, without ``PYTHONTRACEMALLOC`` (which would
    slow every process the tests start).
    """

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        loop = super().new_event_loop()
        setattr(loop, _ORIGIN, "".join(traceback.format_stack(limit=14)[:-1]))
        return loop


asyncio.set_event_loop_policy(_LoopsKnowWhereTheyWereMade())
