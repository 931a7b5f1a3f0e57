"""Runnable examples quoted by the README; a test runs each and compares what it prints.

``call_tools.py`` and ``lazybridge_agent.py``:
``tests/integration/test_frameworks_and_examples.py``; the other frameworks' examples:
their tests in ``tests/integration/frameworks/``.
"""
