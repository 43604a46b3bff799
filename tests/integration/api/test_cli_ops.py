"""Every operator verb of the CLI against a running daemon, with the exit codes scripts use."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from scheduler.cli.main import main
from tests.integration.api.harness import ADMIN, READ, TARGET, ApiHarness, envelope, poll


class Cli:
    """Runs `scheduler ...` in a thread (its HTTP client is synchronous) and captures output."""

    def __init__(self, api: ApiHarness, capsys: pytest.CaptureFixture[str]) -> None:
        self.api, self.capsys = api, capsys

    async def __call__(self, *argv: str, token: str | None = ADMIN) -> tuple[int, str, str]:
        args = [*argv, "--url", self.api.url] + (["--token", token] if token else [])
        self.capsys.readouterr()
        code = await asyncio.to_thread(main, args)
        out, err = self.capsys.readouterr()
        return code, out, err

    async def json(self, *argv: str) -> Any:  # the CLI's JSON answer
        code, out, err = await self(*argv, "--json")
        assert code == 0, err
        return json.loads(out)


@pytest.fixture
def cli(api: ApiHarness, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(api, capsys)


async def test_status_and_schedule_verbs(api: ApiHarness, cli: Cli) -> None:
    """status, schedules list/show/pause/resume/trigger print tables (or JSON) and exit 0."""
    await api.start()
    listed = await poll(lambda: cli.json("schedules", "list"), lambda d: len(d["items"]) == 3)
    assert [j["name"] for j in listed["items"]] == ["every-second", "frozen", "nightly"]
    code, out, _ = await cli("status")
    assert code == 0 and "leader         test-1" in out and "dead letters   0 unresolved" in out
    code, out, _ = await cli("schedules", "list", token=READ)
    assert code == 0 and out.splitlines()[0].split() == [
        "NAME", "CRON", "TZ", "SUBJECT", "STATE", "NEXT", "RUN", "LAST", "FIRED",
    ]  # fmt: skip
    assert any(line.startswith("frozen") and " paused " in line for line in out.splitlines())
    code, out, _ = await cli("schedules", "show", "nightly")
    assert code == 0 and "next occurrences:" in out and "(Europe/Berlin)" in out
    assert "\nfailed         no\n" in out
    assert (await cli("schedules", "pause", "nightly"))[1].strip() == "nightly: paused"
    shown = await cli.json("schedules", "show", "nightly")
    assert isinstance(shown, dict) and shown["paused"] and shown["paused_by"].startswith("admin")
    assert (await cli("schedules", "resume", "nightly"))[1].strip() == "nightly: resumed"
    code, out, _ = await cli("schedules", "trigger", "nightly")
    assert code == 0 and "triggered as nightly@manual-" in out and "SCHEDULED #" in out


async def test_delayed_verbs(api: ApiHarness, cli: Cli) -> None:
    """delayed list/show/cancel/reschedule work by id; --in and --at both reschedule."""
    await api.start()
    now = datetime.now(UTC)
    a, b = envelope(now + timedelta(hours=1)), envelope(now + timedelta(hours=2))
    await api.publish(TARGET, a)
    await api.publish(TARGET, b)
    await poll(lambda: cli.json("delayed", "list"), lambda d: len(d["items"]) == 2)
    code, out, _ = await cli("delayed", "list", "--subject", TARGET, "--limit", "1")
    assert code == 0 and a["id"] in out and b["id"] not in out and "more: --cursor " in out
    code, out, _ = await cli("delayed", "list", "--limit", "1", "--all")
    assert a["id"] in out and b["id"] in out and "more:" not in out
    code, out, _ = await cli("delayed", "show", a["id"])
    assert code == 0 and "status         pending" in out
    assert (await cli("delayed", "cancel", a["id"]))[1].strip() == f"{a['id']}: cancelled"
    code, out, _ = await cli("delayed", "reschedule", b["id"], "--in", "10m")
    assert code == 0 and f"{b['id']}: rescheduled" in out
    at = (now + timedelta(hours=3)).replace(microsecond=0)
    moved = await cli.json("delayed", "reschedule", b["id"], "--at", at.isoformat())
    assert isinstance(moved, dict) and moved["status"] == "rescheduled"
    shown = await cli.json("delayed", "show", b["id"])
    assert isinstance(shown, dict) and datetime.fromisoformat(shown["due_at"]) == at


async def test_dlq_verbs(api: ApiHarness, cli: Cli) -> None:
    """dlq list/show/replay (by id and --matching)/resolve (and --reopen)."""
    await api.start(max_attempts=1)
    docs = [envelope(None) for _ in range(3)]
    for doc in docs:
        await api.publish("mq.nowhere.x", doc)
    dead = await poll(lambda: cli.json("dlq", "list"), lambda d: len(d["items"]) == 3)
    ids = [d["id"] for d in dead["items"]]
    code, out, _ = await cli("dlq", "list", "--unresolved", "--reason", "publish_failed")
    assert code == 0 and all(i in out for i in ids)
    code, out, _ = await cli("dlq", "show", ids[0])
    assert code == 0 and "reason         publish_failed" in out and "no stream" in out
    shown = await cli.json("dlq", "show", ids[0])  # a firing dead letter keeps its task whole
    assert isinstance(shown, dict) and not shown["raw_truncated"]
    assert shown["raw_size"] == len(base64.b64decode(shown["raw_base64"])) > 0
    assert f"size           {shown['raw_size']} bytes\n" in out
    assert f"\npayload:\n  {base64.b64decode(shown['raw_base64']).decode()}\n" in out + "\n"
    code, out, _ = await cli("dlq", "resolve", ids[2])
    assert code == 0 and "resolved by admin" in out
    assert (await cli("dlq", "resolve", ids[2], "--reopen"))[1].strip() == f"{ids[2]}: open"
    await api.js.add_stream(name="NOWHERE", subjects=["mq.nowhere.>"], duplicate_window=120)
    code, out, _ = await cli("dlq", "replay", ids[0])
    assert code == 0 and "replayed" in out
    code, out, _ = await cli("dlq", "replay", ids[0], ids[1])
    assert code == 1 and "already_replayed" in out and "replayed" in out
    code, out, _ = await cli("dlq", "replay", "--matching", "--subject", "mq.nowhere.x")
    assert code == 0 and ids[2] in out
    msgs = await api.read_stream("NOWHERE", quiet=1.0)
    assert sorted(m.headers["Nats-Msg-Id"] for m in msgs) == sorted(d["id"] for d in docs)
    code, out, _ = await cli("dlq", "list")  # unresolved ones only, by default
    assert code == 0 and out.strip() == "no unresolved dead letters (--state all lists every one)"
    code, out, _ = await cli("dlq", "list", "--state", "all")
    assert [line.split()[1] for line in out.splitlines()[1:]] == ["replayed"] * 3


async def test_exit_codes_and_messages_say_what_to_do(api: ApiHarness, cli: Cli) -> None:
    """0 done; 1 refused or not found (with the variable to set); 2 usage or invalid input;
    3 when the daemon cannot be reached."""
    await api.start()
    code, _, err = await cli("delayed", "show", "no-such-task")
    assert code == 1 and "404: no delayed task with id 'no-such-task'" in err
    code, _, err = await cli("schedules", "pause", "nightly", token=READ)
    assert code == 1 and "403:" in err and "SCHEDULER_ADMIN_TOKEN" in err
    code, _, err = await cli("schedules", "pause", "nightly", token="bogus")
    assert code == 1 and "401:" in err and "set SCHEDULER_ADMIN_TOKEN or pass --token" in err
    code, _, err = await cli("schedules", "list", token="bogus")
    assert code == 1 and "set SCHEDULER_READ_TOKEN" in err
    code, _, err = await cli("delayed", "list", "--limit", "0")
    assert code == 2 and "422:" in err and "limit" in err
    code, _, err = await cli("dlq", "replay")
    assert code == 2 and "give dead-letter ids" in err
    with pytest.raises(SystemExit) as usage:
        await cli("delayed", "reschedule", "x", "--at", "2030-01-01T00:00")
    assert usage.value.code == 2
    code = await asyncio.to_thread(main, ["status", "--url", "http://127.0.0.1:9"])
    assert code == 3
