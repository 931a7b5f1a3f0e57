"""Worker side: your own tools, served next to the starter catalogue.

Run a worker that serves them:

    TOOLEXEC_TOOL_MODULES=tasks,examples.my_tools celery -A executor worker -Q default,payments
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from executor import current_call, report_progress, tool


class Address(BaseModel):
    """A postal address."""

    city: str
    country: Annotated[
        str, Field(min_length=2, max_length=2, description="ISO 3166 country code, e.g. 'GB'")
    ]


@tool
def word_count(text: str, unit: Literal["words", "characters"] = "words") -> dict[str, int]:
    """Count the words or characters in a text.

    Args:
        text: The text to measure.
        unit: What to count.
    """
    return {unit: len(text.split()) if unit == "words" else len(text)}


@tool(idempotent=True, queue="payments", timeout=10)
async def charge_card(
    customer_id: str, amount_cents: Annotated[int, Field(gt=0)], billing: Address
) -> dict[str, str]:
    """Charge a customer's card once per agent run, whatever the model repeats.

    Args:
        customer_id: The customer to charge.
        amount_cents: The amount in cents.
        billing: The billing address on file.
    """
    key = current_call().idempotency_key  # pass it on as the payment API's Idempotency-Key
    # A new id per execution: two results with one charge_id are one charge.
    return {
        "charge_id": f"ch_{uuid.uuid4().hex[:12]}",
        "amount_cents": str(amount_cents),
        "key": key or "",
    }


@tool
def reindex(paths: list[str]) -> int:
    """Re-index the documents at `paths`, telling the caller how far it got after each one.

    Args:
        paths: The documents to re-index.
    """
    for done, path in enumerate(paths, 1):
        time.sleep(0.05)  # the work on one document
        report_progress(done, len(paths), f"indexed {path}")
    return len(paths)
