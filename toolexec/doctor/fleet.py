"""The doctor's view of the fleet: the tools the catalog lists, and ``same-tools-per-queue``.

* the catalog in Redis adds the tools other workers publish to the ones this worker
  registers (:func:`catalog_specs`);
* ``same-tools-per-queue``: every live worker serves every tool the live workers of
  its queues serve (a call goes to whichever worker takes it first, so one that lacks
  the tool answers ``ToolNotFound``).
"""

from __future__ import annotations

import pydantic
import redis

from toolexec.doctor.check import Check, cannot_read, failed, passed
from wire import keys
from wire.models import ToolSpec
from wire.redis_errors import explain

__all__ = ["catalog_specs", "same_tools_per_queue"]


def catalog_specs(client: redis.Redis) -> tuple[list[ToolSpec], str]:
    """The specs in the catalog, and why it could not be read (empty when it was)."""
    try:
        raw = client.hgetall(keys.CATALOG)
    except redis.RedisError as exc:
        return [], explain(exc)
    specs = []
    for value in raw.values():
        try:
            specs.append(ToolSpec.model_validate_json(value))
        except pydantic.ValidationError:
            continue
    return specs, ""


def same_tools_per_queue(client: redis.Redis) -> Check:
    """The same-tools-per-queue check, over the live workers."""
    from toolexec.status import read_live

    name = "same-tools-per-queue"
    try:
        live = read_live(client)
    except redis.RedisError as exc:
        return cannot_read(name, "the live workers", explain(exc))
    missing = live.missing_tools()
    if not missing:
        queues = sorted({queue for worker in live.workers for queue in worker.queues})
        return passed(
            name,
            f"{len(live.workers)} live worker(s); on each of "
            f"{', '.join(queues) or 'no queue'} every worker serves the same tools",
        )
    found = "; ".join(
        f"{worker.worker_id} consumes {queue!r} without {', '.join(tools)}"
        for worker, queue, tools in missing
    )
    return failed(
        name,
        f"{found}: calls for those tools that worker takes fail with ToolNotFound",
        fix="load the same TOOLEXEC_TOOL_MODULES on every worker of a queue (docs/deploy.md), "
        "or give the other tools a queue of their own",
    )
