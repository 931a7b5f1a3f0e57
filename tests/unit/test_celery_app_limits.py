"""The worker refuses to start when Redis would redeliver a call that is still running."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from executor.registry import tool, unregister
from executor.seams.app import create_app
from wire.errors import ConfigurationError
from wire.settings import Settings


@pytest.fixture
def near_the_limit() -> Iterator[str]:
    @tool(name="near_the_visibility_limit", hard_timeout=59.5)
    def near_the_visibility_limit() -> str:
        """A tool whose hard limit plus Celery's margin reaches a 60 s visibility timeout."""
        return "done"

    yield "near_the_visibility_limit"
    unregister("near_the_visibility_limit")


def test_a_hard_limit_within_celerys_margin_of_the_visibility_timeout_is_refused(
    near_the_limit: str,
) -> None:
    with pytest.raises(
        ConfigurationError, match=r"60s\) must exceed .*59\.5s\) plus Celery's 1s margin"
    ):
        create_app(Settings(visibility_timeout=60))


def test_a_visibility_timeout_beyond_the_hard_limit_and_margin_is_accepted(
    near_the_limit: str,
) -> None:
    app = create_app(Settings(visibility_timeout=61))

    assert app.conf.broker_transport_options["visibility_timeout"] == 61
