"""``toolexec doctor``: check a deployment against docs/security.md and say what to fix.

:func:`run_checks` reads the settings, the worker app's Celery configuration and the
Redis the settings name, and returns one :class:`Check` per rule, each with its own
finding (one that cannot be checked fails, saying why, and the others still run):

* ``json-only``: the worker app reads and writes JSON only, whatever its configuration
  comes from (``--app``, ``CELERY_CONFIG_MODULE``, ``celeryconfig``);
* ``ttls``: no ``toolexec:*`` key but the catalog lives without a TTL (a sample of up
  to ``sample`` keys, read with ``SCAN`` and ``TTL``); the TTL settings are positive by
  construction (:class:`~wire.settings.Settings` refuses others);
* ``visibility-timeout``: above every tool's hard limit plus Celery's margin
  (:data:`wire.message.CELERY_LIMIT_MARGIN`), the tools of this worker and
  those in the catalog;
* ``transport-security``: every broker and Redis URL off the loopback interface has
  TLS or credentials of its own (a Redis password; a RabbitMQ user other than
  ``guest``), and no ``rediss://`` URL turns certificate checks off;
* ``persistence``: Redis keeps an append-only file when idempotent tools are registered
  (their stored outcomes are what stops a repeated booking), read with ``INFO
  persistence`` (``CONFIG GET`` if that is refused);
* ``signing``: ``TOOLEXEC_SIGNING_KEY`` is set when the broker is reachable beyond
  this machine.
* ``same-tools-per-queue``: every live worker serves every tool the live workers of
  its queues serve (a call goes to whichever worker takes it first, so one that lacks
  the tool answers ``ToolNotFound``).

:func:`main` prints them as a table (or ``--json``) and exits 1 when one fails; run it
with ``toolexec doctor`` or ``python -m toolexec.doctor``.

The checks live by theme: :mod:`~toolexec.doctor.security` (json-only,
transport-security, signing), :mod:`~toolexec.doctor.durability` (ttls,
visibility-timeout, persistence) and :mod:`~toolexec.doctor.fleet` (the catalog,
same-tools-per-queue); :mod:`~toolexec.doctor.check` is what a check finds, and
:mod:`~toolexec.doctor.runner` runs them in order and prints them.
"""

from __future__ import annotations

from toolexec.doctor.check import Check
from toolexec.doctor.runner import main, run_checks
from toolexec.doctor.security import url_problems

__all__ = ["Check", "main", "run_checks", "url_problems"]
