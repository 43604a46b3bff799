"""Errors in the schedules YAML reach the operator's CLI: `status` and `schedules list` against a
running daemon (real NATS and PostgreSQL) name them, and `status` fails until they are fixed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.api.harness import READ, ApiHarness, poll
from tests.integration.api.test_cli_ops import Cli

TYPO = """\
scheduled_jobs:
  - name: hourly-report
    subject: mq.scheduled.report
    crn: "0 * * * *"
    data: {}
"""
FIXED = TYPO.replace("crn:", "cron:")


@pytest.fixture
def cli(api: ApiHarness, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(api, capsys)


async def test_status_and_schedules_list_show_yaml_errors(api: ApiHarness, cli: Cli) -> None:
    """A job with a typo is not loaded: `schedules list` lists the valid jobs and names the
    file, line, job and error under the table (exit 0); `status` names them too and exits 1,
    with them in its JSON; once the file is fixed `status` exits 0 and the job is listed."""
    typo = Path(api.settings.schedules_dir) / "typo.yaml"
    typo.write_text(TYPO)
    await api.start()
    await poll(lambda: cli.json("schedules", "list"), lambda d: len(d["items"]) == 3)
    where = f"{typo}:4: job hourly-report: unknown key 'crn'"

    code, out, err = await cli("schedules", "list", token=READ)
    assert code == 0, err
    table, block = out.split("\n\n")
    assert [line.split()[0] for line in table.splitlines()[1:]] == [
        "every-second", "frozen", "nightly",
    ]  # fmt: skip
    assert block.startswith("schedule YAML: 2 errors; the jobs named are not loaded")
    assert f"\n  {where} (known: name, subject, cron," in block
    assert f"\n  {typo}:2: job hourly-report: missing required key 'cron'" in block

    code, out, err = await cli("status", token=READ)
    assert code == 1, err
    assert "schedule YAML  2 errors (below)" in out and f"  {where}" in out
    code, out, _ = await cli("status", "--json", token=READ)
    doc = json.loads(out)
    assert code == 1 and [(p["line"], p["job"]) for p in doc["problems"]] == [
        (2, "hourly-report"), (4, "hourly-report"),
    ]  # fmt: skip

    typo.write_text(FIXED)
    await poll(lambda: cli("status", token=READ), lambda got: got[0] == 0, within=10)
    code, out, _ = await cli("status", token=READ)
    assert "schedule YAML  ok" in out
    listed = await poll(lambda: cli.json("schedules", "list"), lambda d: len(d["items"]) == 4)
    assert "hourly-report" in [j["name"] for j in listed["items"]] and not listed["problems"]
