"""Agent side: call remote tools from plain Python, sync and async.

Needs a worker serving ``tasks`` and ``examples.my_tools`` (see ``my_tools.py``) and the
same ``TOOLEXEC_*`` settings. Prints::

    word_count -> {'words': 4}
    search -> the-red-headed-league.txt
    ToolArgumentsInvalid: invalid arguments for tool 'word_count': unit: 'lines' is not one of ['words', 'characters']
    ToolTimeoutError: tool 'slow_report' timed out after 0.3s
    a repeat in one run is the same charge: True
    a new run is a new charge: True
"""  # noqa: E501

from __future__ import annotations

import asyncio

from agent_client import ToolArgumentsInvalid, ToolTimeoutError, remote_tool, run_scope


def main() -> None:
    word_count = remote_tool("word_count")
    print("word_count ->", word_count(text="the deadline is exact"))

    search = remote_tool("search")
    hits = asyncio.run(search.run(query="red-headed league", limit=1))
    print("search ->", hits[0]["source"])

    try:
        word_count(text="x", unit="lines")
    except ToolArgumentsInvalid as exc:  # checked before anything is sent
        print(f"ToolArgumentsInvalid: {exc}")

    try:
        remote_tool("slow_report", timeout=0.3)(seconds=5)
    except ToolTimeoutError as exc:  # raised at 0.3 s; the worker's late result is dropped
        print(f"ToolTimeoutError: {exc}")

    charge = remote_tool("charge_card")
    billing = {"city": "London", "country": "GB"}
    with run_scope():  # one agent run; the model repeats its call
        first = charge(customer_id="c-42", amount_cents=1999, billing=billing)
        again = charge(amount_cents=1999.0, billing=billing, customer_id="c-42")
    with run_scope():  # the next run
        later = charge(customer_id="c-42", amount_cents=1999, billing=billing)
    print("a repeat in one run is the same charge:", again["charge_id"] == first["charge_id"])
    print("a new run is a new charge:", later["charge_id"] != first["charge_id"])


if __name__ == "__main__":
    main()
