"""The README quotes the example files as they are, so what it shows is what runs."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_quotes_my_tools_from_its_imports_to_its_last_line() -> None:
    readme = (ROOT / "README.md").read_text()
    source = (ROOT / "examples" / "my_tools.py").read_text()
    quoted = source[source.index("import uuid") :].rstrip()

    assert quoted in readme


def test_the_charge_card_example_returns_an_id_per_execution_so_equal_results_mean_one_charge() -> (
    None
):
    source = (ROOT / "examples" / "my_tools.py").read_text()
    charge = source[source.index("async def charge_card") :]

    assert '"charge_id": f"ch_{uuid.uuid4().hex[:12]}"' in charge
    assert "return None" not in charge
