"""The markers `scripts/test --quick` and the documented `-m` subsets select by are on the tests
when `-m` is applied (tests/conftest.py): put on after it, they selected every test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests/integration/test_delayed.py"


def collected(*marks: str) -> list[str]:
    """The node ids pytest collects from MODULE with these `-m` arguments (no worker, no run)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist",
         "-p", "no:cacheprovider", *marks, MODULE],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode in (0, 5), done.stdout + done.stderr  # 5: nothing selected
    return [line for line in done.stdout.splitlines() if line.startswith(MODULE)]


def test_the_quick_selection_keeps_only_the_smoke_path_of_an_integration_module() -> None:
    """`not integration or (smoke and not compat)` (what --quick passes) keeps the module's
    smoke tests on current servers and nothing else of it."""
    everything = collected()
    quick = collected("-m", "not integration or (smoke and not compat)")
    assert len(everything) > len(quick) > 0
    assert all(node.endswith("[current]") for node in quick), quick


def test_not_compat_leaves_out_every_compat_run() -> None:
    """`-m "not compat"` keeps the current-server runs and drops the 2.10/15 ones."""
    ids = collected("-m", "not compat")
    assert ids and not any("[compat]" in node for node in ids), ids
    assert any("[compat]" in node for node in collected("-m", "compat"))
