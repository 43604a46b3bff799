"""The package's layout names the parts of the system (docs/architecture.md): a small root of
shared modules, one folder per part, each saying what it holds, and no test code shipped."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "scheduler"
ROOT_LIMIT = 12
PARTS = {
    "messages", "cron", "engine", "engine/delayed", "engine/cron", "leadership", "store",
    "store/postgres", "bus", "bus/nats", "operations", "api", "console", "cli", "daemon", "audit",
}  # fmt: skip


def test_the_root_keeps_at_most_twelve_modules() -> None:
    """Shared modules only (records, errors, settings, metrics, clock...); a part's code lives in
    the part's folder."""
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= ROOT_LIMIT, modules


def test_every_part_has_its_folder_and_says_what_it_holds() -> None:
    """Each part named in the architecture guide is a package whose `__init__` docstring says
    what it holds, so a newcomer reading the tree reads the system."""
    for part in sorted(PARTS):
        init = PACKAGE / part / "__init__.py"
        assert init.is_file(), f"scheduler/{part} is not a package"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.split()) >= 5, f"scheduler/{part}/__init__.py says nothing"


def test_every_package_is_a_named_part() -> None:
    """A new folder is added to the guide (and to PARTS) or it does not belong."""
    found = {
        str(p.parent.relative_to(PACKAGE))
        for p in PACKAGE.rglob("__init__.py")
        if p.parent != PACKAGE and "__pycache__" not in p.parts
    }
    extras = {"api/routes"}  # the API's routes, one module per resource
    assert found - PARTS - extras == set()


def test_the_runtime_package_ships_no_test_code() -> None:
    """Nothing in scheduler/ imports the tests (the synthetic log generator lives in
    tests/support/synth.py)."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path}: {n}" for n in names if n.split(".")[0] == "tests"]
    assert offenders == []
