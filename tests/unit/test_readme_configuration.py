"""The README's configuration table matches the settings the code reads."""

from __future__ import annotations

import re
from pathlib import Path

from wire.settings import ENVIRONMENT_VARIABLES, Settings

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
ROWS = dict(re.findall(r"^\| `(TOOLEXEC_[A-Z_]+)` \| `?([^`|]*?)`? \|", README, flags=re.MULTILINE))


def test_every_setting_has_a_row_and_every_row_is_a_setting() -> None:
    assert set(ROWS) == set(ENVIRONMENT_VARIABLES.values())


def test_each_plain_default_in_the_table_is_the_codes_default() -> None:
    defaults = Settings.from_env({})
    for field, variable in ENVIRONMENT_VARIABLES.items():
        shown = ROWS[variable]
        value = getattr(defaults, field)
        if isinstance(value, bool):
            assert shown == str(value).lower(), variable
        elif isinstance(value, int | float) and not isinstance(value, bool):
            assert float(shown) == float(value), variable
        elif isinstance(value, tuple):
            assert shown == ",".join(value), variable
        elif field == "broker_url":
            assert shown == value, variable
