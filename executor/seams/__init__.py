"""The Celery seams: everything of the worker that plugs into Celery's, kombu's and
billiard's hooks, and the only modules (with :mod:`executor.pools`) that import them.

* ``app``: the Celery app (``create_app``, ``get_app``, built lazily as
  ``executor.app``) and the worker's signal handlers: heartbeat, metrics, log format;
* ``lockdown``: the worker bootstep (JSON only, toolexec's tasks only, credentials
  checked, no tool data in Celery's error logs) and the check of a call's signature;
* ``request``: the task's ``Request`` (malformed calls refused, a dead pool child's
  holds released, deliveries counted) and its ``Strategy``;
* ``events``: task events when they are wanted (``TOOLEXEC_TASK_EVENTS``): a worker
  bootstep and Celery's ``enable_events`` control command;
* ``consumer``: Celery's consumer, refusing every message it cannot run;
* ``deadletter``: the capped dead-letter list every refusal is recorded in;
* ``transport``: kombu's Redis transport, refusing a queue item it cannot read;
  ``batched_read``: taking up to 100 calls per round trip (``BLMPOP``);
  ``put_back``: putting back, once, the calls taken but not started when the broker
  connection breaks, and standing down their copies here;
* ``backend``: a result backend that stores nothing and reports calls lost in the
  main process.

This package imports nothing itself: Celery imports each seam by its path.
"""
