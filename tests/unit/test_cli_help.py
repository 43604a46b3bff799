"""`scheduler --help` points at places that exist, and exit status 3 means one thing wherever
it is documented."""

from __future__ import annotations

import re

from scheduler.cli import main as cli
from tests.support.docs_blocks import ROOT


def headings(page: str) -> set[str]:
    text = (ROOT / page).read_text()
    return {m.group(1).strip() for m in re.finditer(r"^#{2,3} (.+)$", text, re.MULTILINE)}


def test_help_names_only_sections_and_pages_that_exist() -> None:
    """Every README section the help names in quotes is a heading there, and every docs page it
    names is a file."""
    readme = cli.EPILOG.split("Read more in the README", 1)[1].split("and docs/", 1)[0]
    named = re.findall(r'"([^"]+)"', readme)
    assert named and set(named) <= headings("README.md"), named
    pages = re.findall(r"\b([a-z-]+\.md)\b", cli.EPILOG)
    assert pages and all((ROOT / "docs" / page).is_file() for page in pages), pages
    assert "Start-up errors" in headings("docs/operations.md")


def test_exit_status_3_is_documented_one_way() -> None:
    """CLI help, module docstring, README and operations.md all say 3 is 'no answer from the
    management API', and none says 'not built yet'."""
    operations = (ROOT / "docs" / "operations.md").read_text()
    readme = (ROOT / "README.md").read_text()
    row = next(line for line in operations.splitlines() if line.startswith("| 3 |"))
    assert "management API" in row
    assert "3 no answer from\nmq-scheduler's API" in readme
    assert "3 the management API could not be\nreached" in cli.EPILOG
    assert "3 an operator verb" in " ".join((cli.__doc__ or "").split())
    for text in (operations, readme, cli.EPILOG, cli.__doc__ or ""):
        assert "not built yet" not in text
