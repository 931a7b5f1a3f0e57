"""The doctor's reading of a broker or Redis URL: when is it unsafe, and why."""

from __future__ import annotations

import pytest

from toolexec.doctor import url_problems
from toolexec.doctor.security import signing
from wire.settings import Settings


@pytest.mark.parametrize(
    "url",
    [
        "redis://localhost:6379/0",
        "redis://127.0.0.1:6379/0",
        "redis://[::1]:6379/0",
        "unix:///run/redis.sock",
        "redis://:s3cret@redis.internal:6379/0",
        "redis://toolexec:s3cret@10.0.0.5:6379/0",
        "rediss://redis.internal:6380/0",
        "rediss://redis.internal:6380/0?ssl_cert_reqs=required&ssl_ca_certs=/ca.pem",
        "amqp://guest:guest@localhost:5672//",
        "amqp://127.0.0.1//",
        "amqp://toolexec:s3cret@rabbit.internal:5672//",
        "amqps://toolexec:s3cret@rabbit.internal:5671//",
        "pyamqp://toolexec:s3cret@10.0.0.7//",
    ],
)
def test_loopback_tls_or_a_password_is_safe_enough(url: str) -> None:
    assert url_problems(url) == []


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis://redis.internal:6379/0", "redis.internal is off the loopback interface"),
        ("redis://toolexec@10.0.0.5:6379/0", "neither TLS nor a password"),
        (
            "rediss://:pw@redis.internal:6380/0?ssl_cert_reqs=none",
            "ssl_cert_reqs=none turns the server certificate check off",
        ),
        ("rediss://127.0.0.1:6380/0?ssl_cert_reqs=CERT_OPTIONAL", "ssl_cert_reqs=cert_optional"),
        ("amqp://rabbit.internal:5672//", "RabbitMQ's default guest account"),
        ("amqp://guest:guest@rabbit.internal:5672//", "RabbitMQ's default guest account"),
        ("amqps://guest:guest@rabbit.internal:5671//", "RabbitMQ's default guest account"),
        ("pyamqp://toolexec@10.0.0.7//", "neither TLS nor a password"),
    ],
)
def test_an_open_or_unchecked_url_is_named_with_its_problem(url: str, problem: str) -> None:
    problems = url_problems(url)

    assert len(problems) == 1 and problem in problems[0]


@pytest.mark.parametrize(
    ("url", "problems"),
    [
        ("sentinel://127.0.0.1:26379;sentinel://[::1]:26380/0", []),
        ("sentinel://:pw@10.0.0.1:26379;sentinel://10.0.0.2:26379/0", []),
        ("sentinel://10.0.0.1:26379;sentinel://10.0.0.2:26379/0?ssl_ca_certs=/ca.pem", []),
        (
            "sentinel://127.0.0.1:26379;sentinel://10.0.0.2:26379/0",
            ["10.0.0.2 is off the loopback interface, and the URL has neither TLS nor a password"],
        ),
        (
            "sentinel://:pw@10.0.0.1:26379;sentinel://10.0.0.2:26379/0?ssl_cert_reqs=none",
            ["ssl_cert_reqs=none turns the server certificate check off"],
        ),
    ],
)
def test_a_sentinel_url_is_read_whole_every_sentinel_and_its_tls(
    url: str, problems: list[str]
) -> None:
    assert url_problems(url, sentinel_master="m") == problems


def test_signing_counts_a_broker_beyond_this_machine_if_any_of_its_sentinels_is() -> None:
    settings = Settings.from_env(
        {
            "TOOLEXEC_BROKER_URL": "sentinel://127.0.0.1:26379;sentinel://10.0.0.2:26379/0",
            "TOOLEXEC_SENTINEL_MASTER": "m",
        }
    )

    check = signing(settings)

    assert not check.ok and "10.0.0.2" in check.message
