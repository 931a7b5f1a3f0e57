"""The pieces of the ``toolexec`` command that :mod:`toolexec.cli` wires together.

* :mod:`~toolexec.commands.exits` — the exit codes and the one-line failure;
* :mod:`~toolexec.commands.arguments` — a call's arguments and ``--timeout``;
* :mod:`~toolexec.commands.call` — ``toolexec call``;
* :mod:`~toolexec.commands.worker` — ``toolexec worker``: the ``celery worker`` command it runs;
* :mod:`~toolexec.commands.status` — ``toolexec tools`` and ``toolexec status``;
* :mod:`~toolexec.commands.render` — tables for people (``tools``, ``status``);
* :mod:`~toolexec.commands.demo` — ``toolexec demo``.
"""

from __future__ import annotations

__all__: list[str] = []
