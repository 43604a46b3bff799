"""The import contracts of pyproject.toml's [tool.importlinter] hold, and catch a breach."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [str(LINT), "--config", str(cwd / "pyproject.toml"), "--no-cache"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_layers_hold() -> None:
    """The engine reaches NATS and PostgreSQL through its ports, store and bus never import
    the engine, and no import cycle joins the scheduler's packages."""
    run = _lint(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize(
    ("module", "line", "breach"),
    [
        ("engine/probe.py", "import nats\n", "scheduler.engine.probe -> nats"),
        ("engine/probe.py", "import asyncpg\n", "scheduler.engine.probe -> asyncpg"),
        (
            "store/probe.py",
            "import scheduler.engine.delayed.horizon\n",
            "scheduler.store.probe -> scheduler.engine.delayed.horizon",
        ),
        (
            "bus/probe.py",
            "import scheduler.engine.delayed.dispatch\n",
            "scheduler.bus.probe -> scheduler.engine.delayed.dispatch",
        ),
        ("store/probe.py", "import scheduler.daemon.lifecycle\n", "scheduler.store.probe"),
        # the console mounts its pages; a page importing the console again is a cycle
        (
            "console/overview.py",
            "import scheduler.console.console\n",
            "No cycles are allowed in scheduler.console",
        ),
    ],
)
def test_a_forbidden_import_breaks_a_contract(
    tmp_path: Path, module: str, line: str, breach: str
) -> None:
    """A copy of the package with one forbidden import added fails lint-imports, naming it."""
    shutil.copytree(ROOT / "scheduler", tmp_path / "scheduler", ignore=_no_cache)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "scheduler" / module).write_text(line)
    run = _lint(tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "BROKEN" in run.stdout
    assert breach in run.stdout, run.stdout


def _no_cache(_: str, names: list[str]) -> list[str]:
    return [n for n in names if n == "__pycache__"]
