"""The Celery seams: everything of the worker that plugs into Celery's, kombu's and
billiard's hooks, and the only modules (with :mod:`executor.pools`) that import them.

* ``app``: the Celery app (``create_app``, ``get_app``, built lazily as
  ``executor.app``) and the worker's signal handlers: heartbeat, metrics, log format;
* ``celery_tasks``: the two Celery tasks, over the call's steps (:mod:`executor.task`);
* ``lockdown``: the worker bootstep (JSON only, toolexec's tasks only, credentials
  checked, no tool data in Celery's error logs) and the check of a call's signature;
* ``request``: the task's ``Request`` (malformed calls refused, a dead pool child's
  holds released, deliveries counted) and its ``Strategy``;
* ``events``: task events when they are wanted (``TOOLEXEC_TASK_EVENTS``): a worker
  bootstep and Celery's ``enable_events`` control command;
* ``consumer``: Celery's consumer, refusing every message it cannot run;
* ``deadletter``: the capped dead-letter list every refusal is recorded in;
* ``transport``: kombu's Redis transport and its one channel: refusing a queue item it
  cannot read, taking up to 100 calls per round trip (``BLMPOP``), composed with
  ``put_back``'s writes: putting back, once, the calls taken but not started when the
  broker connection breaks; ``put_back``'s ledger stands down their copies here;
* ``backend``: a result backend that stores nothing and reports calls lost in the
  main process.

This package imports nothing itself: Celery imports each seam by its path.
"""
