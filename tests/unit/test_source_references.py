"""What the code's comments point a reader at exists in the repo: no "design section N" of a
document the repo does not hold, and every `docs/...` page named is a file."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "scheduler").rglob("*.py"), *(ROOT / "tests").rglob("*.py")])
DOCS_PATH = re.compile(r"(?<![/\w])docs/([A-Za-z0-9_./-]*[A-Za-z0-9_-])")  # not a URL path
# written about, not pointed at: what this test looks for, in its own text
THIS = Path(__file__).resolve()


def test_no_comment_cites_a_design_document_outside_the_repo() -> None:
    """No source cites "design section N" (the design notes are not in the repo)."""
    cited = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in SOURCES
        if p != THIS
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"design section", line, re.IGNORECASE)
    ]
    assert cited == []


def test_every_docs_page_the_code_names_exists() -> None:
    """Each `docs/<page>` named in the package's source is a file (or folder) of the repo."""
    missing = []
    for path in sorted((ROOT / "scheduler").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for name in DOCS_PATH.findall(line):
                target = ROOT / "docs" / name
                if not (target.exists() or target.with_suffix(".md").exists()):
                    missing.append(f"{path.relative_to(ROOT)}:{n}: docs/{name}")
    assert missing == []
