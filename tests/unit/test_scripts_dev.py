"""scripts/dev installs only when it must and says what it is doing (the install itself is
stood in for by a fake `.venv/bin/python` that records its calls)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.docs_blocks import ROOT

FAKE_PYTHON = """#!/usr/bin/env bash
# stands in for .venv/bin/python: records the call; `-m pip install` makes bin/scheduler
echo "$*" >> "$(dirname "$0")/calls"
if [ "$1 $2 $3" = "-m pip install" ]; then
  [ -f "$(dirname "$0")/fail" ] && { echo "pip: no such package" >&2; exit 1; }
  printf '#!/usr/bin/env bash\\necho "scheduler $*"\\n' > "$(dirname "$0")/scheduler"
  chmod +x "$(dirname "$0")/scheduler"
fi
"""


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A folder with scripts/dev, a pyproject.toml and a .venv whose python is the fake."""
    (tmp_path / "scripts").mkdir()
    shutil.copy2(ROOT / "scripts" / "dev", tmp_path / "scripts" / "dev")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return tmp_path


def dev(checkout: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run scripts/dev with `env` over this process's environment (less its SCHEDULER_*)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    return subprocess.run(
        [str(checkout / "scripts" / "dev"), "--data-dir", "d"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=base | env,
    )


def pip_calls(checkout: Path) -> int:
    calls = checkout / ".venv" / "bin" / "calls"
    lines = calls.read_text().splitlines() if calls.exists() else []
    return sum(line.startswith("-m pip install") for line in lines)


def test_first_run_installs_and_says_so_later_runs_do_not(checkout: Path) -> None:
    """The first run installs, announcing it; a second run with the same pyproject.toml skips
    pip and goes straight to `scheduler run --embedded` with the arguments given."""
    first = dev(checkout)
    assert first.returncode == 0, first.stderr
    assert "installing mq-scheduler[embedded] into .venv (first run" in first.stderr
    assert first.stdout.strip() == "scheduler run --embedded --data-dir d"
    assert pip_calls(checkout) == 1
    second = dev(checkout)
    assert second.returncode == 0 and "install" not in second.stderr
    assert "starting the daemon" in second.stderr
    assert pip_calls(checkout) == 1


def test_a_changed_pyproject_installs_again(checkout: Path) -> None:
    """Editing pyproject.toml (new dependencies, entry points) makes the next run reinstall."""
    dev(checkout)
    (checkout / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "2"\n')
    again = dev(checkout)
    assert "pyproject.toml changed: updating .venv" in again.stderr
    assert pip_calls(checkout) == 2


def test_a_failed_install_stops_and_is_retried(checkout: Path) -> None:
    """A failed pip install ends scripts/dev with pip's message and leaves no stamp, so the
    next run tries again."""
    (checkout / ".venv" / "bin" / "fail").touch()
    failed = dev(checkout)
    assert failed.returncode == 1 and "pip: no such package" in failed.stderr
    assert "the install failed" in failed.stderr and failed.stdout == ""
    (checkout / ".venv" / "bin" / "fail").unlink()
    assert dev(checkout).returncode == 0
    assert pip_calls(checkout) == 2


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({}, "(embedded nats-server and PostgreSQL in .scheduler-data/); Ctrl-C stops all three"),
        (
            {"SCHEDULER_DATABASE_URL": "postgresql://u:secret@db/x"},
            "(embedded nats-server in .scheduler-data/, PostgreSQL from SCHEDULER_DATABASE_URL); "
            "Ctrl-C stops both",
        ),
        (
            {"SCHEDULER_NATS_URL": "nats://u:secret@n:4222"},
            "(NATS from SCHEDULER_NATS_URL, embedded PostgreSQL in .scheduler-data/)",
        ),
        (
            {"SCHEDULER_NATS_URL": "nats://n:4222", "SCHEDULER_DATABASE_URL": "postgresql://db/x"},
            "nothing embedded); Ctrl-C stops the daemon",
        ),
    ],
)
def test_the_start_line_names_only_the_servers_it_embeds(
    checkout: Path, env: dict[str, str], says: str
) -> None:
    """With a URL set, scripts/dev does not claim to embed that server (and never prints the
    URL, which may hold a password)."""
    run = dev(checkout, **env)
    assert run.returncode == 0, run.stderr
    assert says in run.stderr
    assert "secret" not in run.stderr
