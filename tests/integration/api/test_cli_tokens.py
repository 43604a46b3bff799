"""The operator CLI against a real daemon with tokens: it finds a dev daemon's URL and token by
itself, and a refused call says which variable or flag to set."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from scheduler.cli.main import main
from scheduler.daemon import dev_access
from scheduler.daemon.dev_access import DevAccess
from tests.integration.api.harness import ADMIN, READ, ApiHarness


async def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def bare_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No SCHEDULER_* variable, and a working folder of the test's own."""
    for name in list(os.environ):
        if name.startswith("SCHEDULER_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


async def test_a_read_without_token_names_the_read_token_and_the_flag(
    api: ApiHarness, bare_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A read with no token against a daemon with tokens: 401, exit 1, and the line names
    SCHEDULER_READ_TOKEN and --token."""
    await api.start()
    code, _, err = await cli(capsys, "delayed", "list", "--url", api.url)
    assert code == 1 and "401:" in err
    assert "set SCHEDULER_READ_TOKEN (or SCHEDULER_ADMIN_TOKEN) or pass --token" in err
    code, _, err = await cli(capsys, "schedules", "pause", "nightly", "--url", api.url)
    assert code == 1 and "set SCHEDULER_ADMIN_TOKEN or pass --token" in err


async def test_a_write_with_the_read_token_asks_for_the_admin_token(
    api: ApiHarness,
    bare_env: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The read token on a write: 403, and the line says it was the read token (from which
    variable) and to set SCHEDULER_ADMIN_TOKEN."""
    await api.start()
    monkeypatch.setenv("SCHEDULER_READ_TOKEN", READ)
    code, _, err = await cli(capsys, "schedules", "pause", "nightly", "--url", api.url)
    assert code == 1 and "403:" in err
    assert "the token from SCHEDULER_READ_TOKEN is the read token: set SCHEDULER_ADMIN_TOKEN" in err


async def test_the_cli_finds_a_dev_daemon_by_its_file(
    api: ApiHarness, bare_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With only .scheduler-data/api.json (as embedded mode writes it), reads and writes work
    with no --url, --token or variable."""
    await api.start()
    # the leader writes the YAML's jobs to PostgreSQL after it takes office, which a busy host
    # may put after the start: pausing before that is a true 404
    async with asyncio.timeout(15):
        while True:
            if (await api.call("GET", "/v1/schedules/nightly", token=READ)).status == 200:
                break
            await asyncio.sleep(0.05)
    access = DevAccess(url=api.url, admin_token=ADMIN, read_token=READ, pid=os.getpid())
    dev_access.write(bare_env / ".scheduler-data" / "api.json", access)
    code, out, err = await cli(capsys, "status")
    assert code == 0 and "leader" in out, err
    code, out, err = await cli(capsys, "schedules", "pause", "nightly")
    assert code == 0 and out.strip() == "nightly: paused", err
