"""wire.keys: every Redis key toolexec writes lives under one prefix; the TTL rule."""

from __future__ import annotations

import inspect

import pytest

from wire import keys
from wire.settings import Settings

#: A claim margin of 30 s, outcomes kept a day, replies ten minutes.
SETTINGS = Settings.from_env(
    {"TOOLEXEC_CLAIM_MARGIN": "30", "TOOLEXEC_OUTCOME_TTL": "86400", "TOOLEXEC_REPLY_TTL": "600"}
)
NOW = 1_900_000_000.0


def test_every_key_is_under_the_toolexec_prefix_and_keys_do_not_collide() -> None:
    made = []
    for name in keys.__all__:
        if name in (
            "PREFIX",
            "HELD_MARKER_BEATS",
            "CALLER_GONE_BEATS",
            "call_ttl_ms",
            "running_keys",
        ):
            continue
        value = getattr(keys, name)
        if callable(value):
            # Each argument its own name: every key a function builds is told apart.
            arguments = inspect.signature(value).parameters
            made.append(value(*(f"x{i}" for i in range(len(arguments)))))
        else:
            made.append(value)

    assert keys.PREFIX == "toolexec:"
    assert len(made) >= 14
    assert all(key.startswith(keys.PREFIX) for key in made)
    assert len(set(made)) == len(made)


def test_per_call_keys_embed_their_id() -> None:
    assert keys.reply("client-7") == "toolexec:reply:client-7"
    assert keys.state("abc123") == "toolexec:state:abc123"
    assert keys.restored("7", "celery") == "toolexec:restored:7:celery"


def ttl(
    key: keys.CallKey, deadline: float | None, hard: float | None, settings: Settings = SETTINGS
) -> int:
    return keys.call_ttl_ms(key, deadline=deadline, hard_timeout=hard, settings=settings, now=NOW)


@pytest.mark.parametrize("key", ["claim", "sent", "running", "deliveries"])
def test_a_calls_keys_outlive_the_time_left_the_hard_limit_and_the_margin(
    key: keys.CallKey,
) -> None:
    assert ttl(key, NOW + 10.0, 5.0) == 45_000
    assert ttl(key, NOW + 10.0, None) == 40_000


def test_a_claim_without_a_deadline_lasts_as_long_as_a_stored_outcome_plus_the_margin() -> None:
    assert ttl("claim", None, None) == 86_430_000
    assert ttl("deliveries", None, 2.0) == 86_432_000


def test_a_sent_marker_without_a_deadline_lasts_as_long_as_a_reply_is_kept() -> None:
    assert ttl("sent", None, 2.0) == 632_000


def test_a_keys_running_state_lives_no_longer_than_a_stored_outcome() -> None:
    short = Settings.from_env({"TOOLEXEC_CLAIM_MARGIN": "30", "TOOLEXEC_OUTCOME_TTL": "20"})

    assert ttl("running", NOW + 10.0, 5.0, short) == 20_000
    assert ttl("running", None, None, short) == 20_000
    assert ttl("claim", NOW + 10.0, 5.0, short) == 45_000


def test_a_calls_keys_whose_deadline_already_passed_still_cover_the_hard_limit_and_the_margin() -> (
    None
):
    assert ttl("claim", NOW - 3.0, 2.0) == 32_000


def test_a_count_of_lost_deliveries_lives_at_least_a_second() -> None:
    none = Settings.from_env({"TOOLEXEC_CLAIM_MARGIN": "0"})

    assert ttl("deliveries", NOW - 3.0, None, none) == 1_000
    assert ttl("claim", NOW - 3.0, None, none) == 0


def test_an_idempotent_calls_holder_is_read_under_its_key_first() -> None:
    assert keys.running_keys("c-1", None) == ("toolexec:running:c-1",)
    assert keys.running_keys("c-1", "k") == ("toolexec:state:k", "toolexec:running:c-1")
