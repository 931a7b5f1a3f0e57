"""Closed event loops and their state are released.

``asyncio.run(tool.run(...))`` makes a new event loop per call. Everything the client
keeps per loop (the batcher that gathers a loop's sends, the futures of its calls)
must go with the loop, or a long-lived process grows with every call.

The calls run in a fresh interpreter of their own, so that what the test session
itself allocates meanwhile (other modules' clients, threads and caches) cannot be
mistaken for a leak, nor hide one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolexec import WorkerProcess

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

#: Calls measured, after 1,000 that warm the process up.
_MEASURED = 4000
#: How much the resident set may grow per measured call: a leak of a kilobyte a call
#: (a loop's batcher, a future) is four times what the measured calls leave (0.8 MiB
#: over 3,000 of them, 1.3 MiB over 9,000, in runs of this test).
_RSS_GROWTH_PER_CALL = 900
_RSS_GROWTH_BOUND = _RSS_GROWTH_PER_CALL * _MEASURED

_CHILD = """
import asyncio, gc, json, os, resource, sys
from pathlib import Path
MEASURED = int(sys.argv[1])
from agent_client import configure, remote_tool

def rss():
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()

def loops():
    return sum(1 for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop))

client = configure()
echo = remote_tool("probe_echo", timeout=30)

def runs(first, count):
    for i in range(first, first + count):
        assert asyncio.run(echo.run(text="leak?", number=i))["number"] == i

runs(0, 1000)
gc.collect()
before = {"rss": rss(), "files": len(os.listdir("/proc/self/fd")), "loops": loops()}
runs(1000, MEASURED)
gc.collect()
after = {"rss": rss(), "files": len(os.listdir("/proc/self/fd")), "loops": loops()}
print(json.dumps({"before": before, "after": after, "batchers": len(client._batchers),
                  "pending": client.replies.pending}))
client.close()
"""


@pytest.mark.timeout(900)  # 5,000 round trips: a few seconds idle, a minute on a busy machine
def test_five_thousand_asyncio_runs_release_their_loops_and_memory_stays_flat(
    probe_env: dict[str, str], probe_worker: WorkerProcess
) -> None:
    run = subprocess.run(
        [sys.executable, "-c", _CHILD, str(_MEASURED)],
        env={**os.environ, **probe_env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=880,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    before, after = seen["before"], seen["after"]

    grown = after["rss"] - before["rss"]
    assert grown < _RSS_GROWTH_BOUND, (
        f"the resident set grew {grown / 2**20:.1f} MiB over {_MEASURED} calls"
    )
    assert after["files"] <= before["files"] + 2  # no loop's self-pipe or socket left open
    assert after["loops"] <= before["loops"]  # every closed loop was freed
    assert seen["batchers"] <= 1
    assert seen["pending"] == 0


# -- a client closed by its owner leaves nothing open ----------------------------------

#: What every scenario's child shares: the counts it reports once the client is closed.
_REPORT = """
import gc, json, os, sys, threading
from agent_client import ToolClient, configure, remote_tool
from agent_client._io.loop import THREAD_NAME
from wire.settings import Settings
import tracemalloc
# after the imports, which it would slow tenfold: the client's objects are traced
tracemalloc.start(20)

_PORT = int(os.environ["TOOLEXEC_REDIS_URL"].rsplit(":", 1)[1].split("/")[0])

def sockets_to_redis():
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own descriptor, closed by now
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    with open("/proc/net/tcp") as table:
        rows = [row.split() for row in table.read().splitlines()[1:]]
    return sum(1 for row in rows if int(row[2].rsplit(":", 1)[1], 16) == _PORT and row[9] in inodes)

def report(who, results):
    gc.collect()
    threads = sum(t.name == THREAD_NAME for t in threading.enumerate())
    print(
        json.dumps(
            {"who": who, "results": results, "sockets": sockets_to_redis(), "threads": threads}
        ),
        flush=True,
    )
"""

# The client is the script's own (not configure()'s), so that once closed and deleted
# nothing references it: whatever it left open is collected, and warned of, at once.
_SYNC = (
    _REPORT
    + """
client = ToolClient(Settings.from_env())
echo = remote_tool("probe_echo", timeout=30, client=client)
results = [echo(text="sync", number=i)["number"] for i in range(5)]
client.close()
del client, echo
report("sync", results)
"""
)

_ASYNCIO = (
    _REPORT
    + """
import asyncio
client = ToolClient(Settings.from_env())
echo = remote_tool("probe_echo", timeout=30, client=client)

async def calls(first):
    return [
        r["number"]
        for r in await asyncio.gather(*(echo.run(text="aio", number=first + i) for i in range(5)))
    ]

results = asyncio.run(calls(0)) + asyncio.run(calls(5))
client.close()
del client, echo
report("asyncio", results)
"""
)

# A proxy made before the fork, on the process's client, as the README makes them.
_FORK = (
    _REPORT
    + """
import asyncio
client = configure()
echo = remote_tool("probe_echo", timeout=30)
assert echo(text="parent", number=-1)["number"] == -1  # the listener and the send link are up
pid = os.fork()
if pid == 0:  # the child: through the inherited proxy, then close, then a normal exit
    results = [
        echo(text="child", number=1)["number"],
        asyncio.run(echo.run(text="child", number=2))["number"],
    ]
    echo.client.close()
    report("child", results)
    sys.exit(0)  # the interpreter's own exit, with its collections: nothing may warn there either
results = [echo(text="parent", number=3)["number"]]
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0
results.append(echo(text="parent", number=4)["number"])  # the child left the parent's loop alone
client.close()
del client, echo
report("parent", results)
"""
)

_IMPATIENT = (
    _REPORT
    + """
client = ToolClient(Settings.from_env())
echo = remote_tool("probe_echo", timeout=30, client=client)
results = [echo(text="impatient", number=i)["number"] for i in range(3)]
# A close under load: its caller stops waiting before the thread has closed anything.
client.io.close(timeout=0.0)
for thread in threading.enumerate():
    if thread.name == THREAD_NAME:
        thread.join(10)
client.close()
del client, echo
report("impatient", results)
"""
)

_NEVER_CLOSED = (
    _REPORT
    + """
client = configure()
echo = remote_tool("probe_echo", timeout=30)
print(
    json.dumps({"who": "unclosed", "results": [echo(text="exit", number=7)["number"]]}),
    flush=True,
)
"""
)


def _run_child(script: str, env: dict[str, str]) -> tuple[list[dict[str, object]], str]:
    """Run ``script`` with unclosed resources as errors and their allocation traced
    (``_REPORT`` starts tracing once its imports are done)."""
    run = subprocess.run(
        [sys.executable, "-W", "error::ResourceWarning", "-c", script],
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads(line) for line in run.stdout.splitlines()], run.stderr


@pytest.mark.parametrize(
    ("script", "reports"),
    [
        (_SYNC, {"sync": [0, 1, 2, 3, 4]}),
        (_ASYNCIO, {"asyncio": list(range(10))}),
        (_FORK, {"child": [1, 2], "parent": [3, 4]}),
        (_IMPATIENT, {"impatient": [0, 1, 2]}),
    ],
    ids=["sync", "asyncio.run", "fork", "closed-without-waiting"],
)
def test_a_client_closed_by_its_owner_leaves_no_socket_transport_or_event_loop_open(
    probe_env: dict[str, str],
    probe_worker: WorkerProcess,
    script: str,
    reports: dict[str, list[int]],
) -> None:
    seen, stderr = _run_child(script, probe_env)

    assert stderr == ""  # no "unclosed ..." ResourceWarning, at collection or at exit
    assert {report["who"]: report["results"] for report in seen} == reports
    for report in seen:
        # Nothing is connected to Redis any more, in the child the parent's copies included.
        assert (report["who"], report["sockets"], report["threads"]) == (report["who"], 0, 0)


def test_a_client_its_owner_never_closed_makes_the_interpreter_exit_warn_of_nothing(
    probe_env: dict[str, str], probe_worker: WorkerProcess
) -> None:
    seen, stderr = _run_child(_NEVER_CLOSED, probe_env)

    assert seen == [{"who": "unclosed", "results": [7]}]
    assert stderr == ""
