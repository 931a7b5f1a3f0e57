"""TOOLEXEC_WORKER_POOL: the pool ``celery -A executor worker`` runs when told none."""

from __future__ import annotations

import pytest
from celery import concurrency

from executor.pools import ASYNCIO_POOL
from executor.pools.asyncio_pool import AsyncioPool
from executor.seams.app import create_app
from toolexec import worker_process
from wire.errors import ConfigurationError
from wire.settings import Settings

BROKER = {"TOOLEXEC_BROKER_URL": "redis://127.0.0.1:1/0"}


def test_the_asyncio_setting_makes_celerys_worker_pool_the_asyncio_pool() -> None:
    settings = Settings.from_env({**BROKER, "TOOLEXEC_WORKER_POOL": "asyncio"}, tool_modules=())

    app = create_app(settings)

    assert app.conf.worker_pool == ASYNCIO_POOL
    assert concurrency.get_implementation(app.conf.worker_pool) is AsyncioPool


@pytest.mark.parametrize("pool", ["prefork", "threads", "solo"])
def test_celerys_own_pools_are_named_as_celery_names_them(pool: str) -> None:
    settings = Settings.from_env({**BROKER, "TOOLEXEC_WORKER_POOL": pool}, tool_modules=())

    assert create_app(settings).conf.worker_pool == pool


def test_without_the_setting_celerys_default_pool_prefork_stays() -> None:
    app = create_app(Settings.from_env(BROKER, tool_modules=()))

    assert app.conf.worker_pool == "prefork"


def test_a_pool_toolexec_does_not_know_is_refused_naming_the_variable() -> None:
    with pytest.raises(ConfigurationError, match="TOOLEXEC_WORKER_POOL"):
        Settings.from_env({**BROKER, "TOOLEXEC_WORKER_POOL": "fibers"})


def test_the_launchers_name_the_same_asyncio_pool_as_the_setting() -> None:
    assert worker_process.ASYNCIO_POOL == ASYNCIO_POOL
