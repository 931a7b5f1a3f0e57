"""wire.connect: a ``sentinel://`` URL and its master's name, as every side reads them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import redis
import redis.asyncio.sentinel
import redis.sentinel

from wire.connect import SentinelGroup, async_pool, kombu_url, sentinel_group, sync_client
from wire.errors import ConfigurationError
from wire.settings import Settings

URL = "sentinel://:s3cret@h1:26380;sentinel://h2;sentinel://h3:26382/0"


def test_a_sentinel_url_names_each_sentinel_and_the_masters_database_and_password() -> None:
    group = sentinel_group(URL, "orders")

    assert group == SentinelGroup(
        sentinels=(("h1", 26380), ("h2", 26379), ("h3", 26382)),
        master="orders",
        db=0,
        password="s3cret",
    )


def test_the_database_and_credentials_come_from_the_first_url_as_kombu_reads_them() -> None:
    group = sentinel_group("sentinel://ann:p%40ss@h1:1/3;sentinel://h2:2", "m")

    assert group is not None
    assert (group.db, group.username, group.password) == (3, "ann", "p@ss")
    assert group.connection_options() == {"db": 3, "username": "ann", "password": "p@ss"}


def test_a_servers_own_url_is_no_group() -> None:
    assert sentinel_group("redis://h:6379/0", None) is None
    assert sentinel_group("redis://h:6379/0", "ignored") is None


@pytest.mark.parametrize(
    ("url", "master", "says"),
    [
        ("sentinel://h1:26379", None, "TOOLEXEC_SENTINEL_MASTER"),
        ("sentinel://h1:26379", "", "TOOLEXEC_SENTINEL_MASTER"),
        ("sentinel://h1:port", "m", "port that is not a number"),
        ("sentinel://h1:1;redis://h2:2", "m", "must start with sentinel:// (part 2)"),
        ("sentinel://:1", "m", "names no host"),
        ("sentinel://h1:1/zero", "m", "database must be a number"),
    ],
)
def test_a_malformed_sentinel_url_is_refused_saying_what_is_wrong(
    url: str, master: str | None, says: str
) -> None:
    with pytest.raises(ValueError) as refused:
        sentinel_group(url, master)

    assert says in str(refused.value)


def test_clients_of_a_group_ask_its_sentinels_for_the_master() -> None:
    client = sync_client(URL, master="orders", socket_timeout=2)
    pool = async_pool(URL, master="orders", socket_timeout=None)

    assert isinstance(client.connection_pool, redis.sentinel.SentinelConnectionPool)
    assert isinstance(pool, redis.asyncio.sentinel.SentinelConnectionPool)
    assert client.connection_pool.connection_kwargs["password"] == "s3cret"
    assert client.connection_pool.connection_kwargs["socket_timeout"] == 2
    client.close()


def test_a_servers_url_makes_a_plain_client() -> None:
    client = sync_client("redis://h:6379/1")

    assert type(client.connection_pool) is redis.ConnectionPool
    assert client.connection_pool.connection_kwargs["db"] == 1
    client.close()


def test_settings_refuse_a_sentinel_url_without_the_masters_name_naming_both() -> None:
    with pytest.raises(ConfigurationError) as refused:
        Settings.from_env({"TOOLEXEC_BROKER_URL": "sentinel://h1:26379/0"})

    message = str(refused.value)
    assert "TOOLEXEC_BROKER_URL" in message and "TOOLEXEC_SENTINEL_MASTER" in message


def test_settings_refuse_a_masters_name_without_a_sentinel_url() -> None:
    with pytest.raises(ConfigurationError, match="neither TOOLEXEC_BROKER_URL nor"):
        Settings.from_env(
            {"TOOLEXEC_BROKER_URL": "redis://h:6379/0", "TOOLEXEC_SENTINEL_MASTER": "m"}
        )


def test_settings_take_sentinels_for_either_role_and_keep_the_password_out_of_the_repr() -> None:
    settings = Settings.from_env(
        {
            "TOOLEXEC_BROKER_URL": "amqp://guest:guest@localhost:5672//",
            "TOOLEXEC_REDIS_URL": URL,
            "TOOLEXEC_SENTINEL_MASTER": "orders",
        }
    )

    assert settings.redis_url == URL and settings.sentinel_master == "orders"
    assert "s3cret" not in repr(settings)
    both = Settings.from_env({"TOOLEXEC_BROKER_URL": URL, "TOOLEXEC_SENTINEL_MASTER": "orders"})
    assert both.redis_url == URL  # the store defaults to the broker, as for redis://


def test_a_redis_error_type_is_what_a_sentinel_client_raises_when_none_answers() -> None:
    client = sync_client("sentinel://127.0.0.1:1/0", master="m", socket_connect_timeout=0.2)

    with pytest.raises(redis.RedisError):
        client.ping()
    client.close()


def test_every_redis_client_of_the_product_is_made_by_wire_connect() -> None:
    root = Path(__file__).resolve().parents[2]
    makers = []
    for package in ("wire", "executor", "agent_client", "tasks", "toolexec"):
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if relative == "wire/connect.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), relative)):
                if isinstance(node, ast.Attribute) and node.attr == "from_url":
                    makers.append(f"{relative}:{node.lineno}")
    assert makers == []


def test_tls_parameters_ending_a_sentinel_url_apply_to_the_sentinels_and_the_master() -> None:
    url = "sentinel://h1:1;sentinel://h2:2/0?ssl_ca_certs=/ca.pem&ssl_cert_reqs=Required"
    group = sentinel_group(url, "m")

    assert group is not None and group.sentinels == (("h1", 1), ("h2", 2))
    assert group.tls_options() == {
        "ssl": True,
        "ssl_ca_certs": "/ca.pem",
        "ssl_cert_reqs": "required",
    }
    client = sync_client(url, master="m")
    assert client.connection_pool.connection_kwargs["ssl_ca_certs"] == "/ca.pem"
    assert type(client.connection_pool).__name__ == "SentinelConnectionPool"
    assert client.connection_pool.connection_class.__name__ == "SentinelManagedSSLConnection"
    assert group.sentinel_options()["ssl"] is True
    client.close()
    assert kombu_url(url) == "sentinel://h1:1;sentinel://h2:2/0"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sentinel://h1:1/0?master=m", "takes no parameter master"),
        ("sentinel://h1:1/0?ssl_cert_reqs=sometimes", "ssl_cert_reqs must be one of"),
        ("sentinel://h1:1/2;sentinel://h2:2/3", "database goes on its first part"),
    ],
)
def test_a_sentinel_url_with_what_it_cannot_take_is_refused_saying_why(url: str, says: str) -> None:
    with pytest.raises(ValueError) as refused:
        sentinel_group(url, "m")

    assert says in str(refused.value)


def test_a_database_on_the_first_part_is_the_masters() -> None:
    group = sentinel_group("sentinel://h1:1/2;sentinel://h2:2/2", "m")

    assert group is not None and group.db == 2


def test_kombu_gets_the_masters_credentials_on_every_part_and_no_tls_parameters() -> None:
    url = "sentinel://ann:p%40ss@h1:1;sentinel://h2:2;sentinel://h3:3/0?ssl_ca_certs=/ca.pem"

    assert kombu_url(url) == (
        "sentinel://ann:p%40ss@h1:1;sentinel://ann:p%40ss@h2:2;sentinel://ann:p%40ss@h3:3/0"
    )
    assert sentinel_group(kombu_url(url), "m") is not None  # the same credentials: accepted


def test_other_credentials_on_a_later_part_are_refused() -> None:
    with pytest.raises(ValueError, match="user and password go on its first part"):
        sentinel_group("sentinel://:a@h1:1;sentinel://:b@h2:2/0", "m")
