"""`scheduler delayed add` and `scheduler schedules backfill` against a running daemon."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.integration.api.harness import READ, TARGET, ApiHarness, poll
from tests.integration.api.test_cli_ops import Cli


@pytest.fixture
def cli(api: ApiHarness, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(api, capsys)


async def test_delayed_add_then_cancel_from_the_cli(api: ApiHarness, cli: Cli) -> None:
    """`delayed add` prints `scheduled <id> to <subject> due <time>`; the task is listed, a
    `delayed cancel` right after cancels it, and `--json` prints the API's answer."""
    await api.start()
    code, out, err = await cli("delayed", "add", "--subject", TARGET, "--in", "10m")
    assert code == 0, err
    match = re.fullmatch(r"scheduled (\S+) to mq\.tasks\.work due (\S+)\n", out)
    assert match is not None, out
    task_id = match.group(1)
    due = datetime.fromisoformat(match.group(2))
    assert timedelta(minutes=9) < due - datetime.now(UTC) <= timedelta(minutes=10)
    code, out, err = await cli("delayed", "cancel", task_id)
    assert (code, out) == (0, f"{task_id}: cancelled\n"), err
    doc = await cli.json("delayed", "add", "--subject", TARGET, "--in", "1h", "--data", "{}")
    assert isinstance(doc, dict) and set(doc) == {"status", "id", "target", "due_at"}
    assert doc["status"] == "scheduled" and doc["target"] == TARGET

    async def listed() -> list[Any]:
        r = await api.call("GET", "/v1/delayed", token=READ, params={"status": "pending"})
        return [t["id"] for t in r.body["items"]]

    assert await poll(listed, bool) == [doc["id"]]
    code, _, err = await cli("delayed", "add", "--subject", "mq.delay.x", "--in", "1m")
    assert code == 2 and "target" in err


async def test_schedules_backfill_from_the_cli(api: ApiHarness, cli: Cli) -> None:
    """`schedules backfill` fires the window's occurrences and says how many; run again it
    fires none (`already fired`)."""
    await api.start()

    async def synced() -> int:
        r = await api.call("GET", "/v1/schedules", token=READ)
        return len(r.body["items"])

    await poll(synced, lambda n: n == 3)
    top = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    window = ["--from", (top - timedelta(hours=3)).isoformat(), "--to", top.isoformat()]
    code, out, err = await cli("schedules", "backfill", "frozen", *window)
    assert code == 0, err
    assert out.startswith("frozen: 3 occurrences in [") and "fired 3, already fired 0" in out
    doc = await cli.json("schedules", "backfill", "frozen", *window)
    assert isinstance(doc, dict) and (doc["fired"], doc["already_fired"]) == (0, 3)
    assert json.dumps(doc).count("already_fired") == 4  # three items and the count
