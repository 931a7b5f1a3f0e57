"""executor.keys: every Redis key toolexec writes lives under one prefix."""

from __future__ import annotations

from executor import keys


def test_every_key_is_under_the_toolexec_prefix_and_keys_do_not_collide() -> None:
    made = []
    for name in keys.__all__:
        if name == "PREFIX":
            continue
        value = getattr(keys, name)
        made.append(value("x") if callable(value) else value)

    assert keys.PREFIX == "toolexec:"
    assert len(made) >= 8
    assert all(key.startswith(keys.PREFIX) for key in made)
    assert len(set(made)) == len(made)


def test_per_call_keys_embed_their_id() -> None:
    assert keys.reply("client-7") == "toolexec:reply:client-7"
    assert keys.outcome("abc123") == "toolexec:outcome:abc123"
