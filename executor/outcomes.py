"""An outcome's wire form: the JSON a worker sends, bounded in size and depth.

The runner (:mod:`executor.runner`) turns what a tool did into a :class:`CallOutcome`;
delivery (:mod:`executor.delivery`) sends it as :func:`encode_outcome` writes it: a
result too large (``TOOLEXEC_MAX_RESULT_BYTES``), nested too deep, or not valid Unicode
is replaced by an error outcome that says so.
"""

from __future__ import annotations

import pydantic_core

from wire.depth import MAX_DEPTH, too_deep
from wire.models import CallOutcome, ErrorKind

__all__ = ["encode_outcome", "too_deep_result"]


def too_deep_result(tool: str, call_id: str, *, worker: str) -> CallOutcome:
    """The outcome sent instead of a result nested deeper than the wire carries."""
    return CallOutcome.failure(
        call_id,
        ErrorKind.EXECUTION,
        "UnserializableResult",
        f"tool {tool!r} returned a value nested deeper than {MAX_DEPTH} levels of arrays and "
        "objects, which toolexec does not send",
        worker=worker,
    )


def encode_outcome(outcome: CallOutcome, *, tool: str, max_bytes: int) -> str:
    """The outcome as JSON, replaced by an error outcome when it exceeds ``max_bytes``
    or cannot be JSON (a string that is not valid Unicode: a lone surrogate)."""
    try:
        encoded = outcome.model_dump_json()
    except pydantic_core.PydanticSerializationError:
        return CallOutcome.failure(
            outcome.call_id,
            ErrorKind.EXECUTION,
            "UnserializableResult",
            f"tool {tool!r} returned text that is not valid Unicode (a lone surrogate), which "
            "cannot be sent as JSON",
            worker=outcome.worker,
        ).model_dump_json()
    if outcome.ok and too_deep(encoded, around=1):  # the outcome's object around the result
        return too_deep_result(tool, outcome.call_id, worker=outcome.worker).model_dump_json()
    size = len(encoded.encode())
    if size <= max_bytes:
        return encoded
    too_big = CallOutcome.failure(
        outcome.call_id,
        ErrorKind.EXECUTION,
        "ResultTooLarge",
        f"tool {tool!r} returned {size} bytes of JSON; the limit is {max_bytes} "
        "(TOOLEXEC_MAX_RESULT_BYTES)",
        worker=outcome.worker,
    )
    return too_big.model_dump_json()
