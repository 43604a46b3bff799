"""`scheduler delayed add` and `scheduler schedules backfill`: what they send, what they print,
and how they retry under their own Idempotency-Key (the API is a recording stand-in)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from scheduler.cli import authoring
from scheduler.cli.apiclient import UNAVAILABLE, ApiClient, ApiFailure
from scheduler.cli.main import main

ANSWER = {
    "status": "scheduled",
    "id": "t-1",
    "target": "mq.tasks.work",
    "due_at": "2026-11-26T15:00:00.000Z",
}


class Recorder:
    """Stands in for ApiClient.call: records each call and answers from a script."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.calls: list[dict[str, Any]] = []

    def __call__(self, method: str, path: str, **kw: Any) -> Any:
        self.calls.append({"method": method, "path": path, **kw})
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    recorder = Recorder([])
    monkeypatch.setattr(
        ApiClient, "call", lambda _, method, path, **kw: recorder(method, path, **kw)
    )
    monkeypatch.setattr(authoring, "RETRY_PAUSE", 0.0)
    return recorder


def test_delayed_add_sends_the_short_form_and_prints_one_line(
    api: Recorder, capsys: pytest.CaptureFixture[str]
) -> None:
    """`delayed add --in` sends subject, `in` (as seconds), data and org with a UUID key, and
    prints `scheduled <id> to <subject> due <time>`."""
    api.answers = [ANSWER]
    argv = ["delayed", "add", "--subject", "mq.tasks.work", "--in", "1m30s"]
    code = main([*argv, "--data", '{"n": 1}', "--org-id", "org-1"])
    assert code == 0
    assert capsys.readouterr().out == (
        "scheduled t-1 to mq.tasks.work due 2026-11-26T15:00:00.000Z\n"
    )
    [call] = api.calls
    assert (call["method"], call["path"]) == ("POST", "/v1/delayed")
    assert call["body"] == {
        "subject": "mq.tasks.work",
        "in": "90s",
        "data": {"n": 1},
        "org_id": "org-1",
    }
    assert len(call["headers"]["Idempotency-Key"]) == 36


def test_delayed_add_json_prints_the_apis_answer_and_reads_data_from_a_file(
    api: Recorder, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`--json` prints the API's answer; `--data @FILE` reads the object from the file; `--at`
    and `--id` go as given."""
    api.answers = [ANSWER]
    data = tmp_path / "data.json"
    data.write_text('{"from": "file"}')
    argv = ["delayed", "add", "--subject", "mq.tasks.work", "--at", "2026-11-26T15:00:00Z"]
    assert main([*argv, "--data", f"@{data}", "--id", "t-1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == ANSWER
    body = api.calls[0]["body"]
    assert body["data"] == {"from": "file"} and body["id"] == "t-1"
    assert body["at"] == "2026-11-26T15:00:00+00:00" and "in" not in body


@pytest.mark.parametrize(
    "extra",
    [
        ["--in", "soon"],
        ["--at", "2026-11-26T15:00:00"],
        ["--in", "5m", "--data", "[1]"],
        ["--in", "5m", "--data", "{nope"],
        ["--in", "5m", "--data", "@/no/such/file"],
        ["--in", "5m", "--at", "2026-11-26T15:00:00Z"],
        [],
    ],
)
def test_delayed_add_refuses_bad_input_before_any_call(
    api: Recorder, extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad duration, a naive time, data that is no JSON object or no readable file, both or
    neither of --at and --in: exit 2 with a message, and no request."""
    with pytest.raises(SystemExit) as exc:
        main(["delayed", "add", "--subject", "mq.tasks.work", *extra])
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err and api.calls == []


def test_retries_reuse_the_key_and_stop_at_a_refusal(
    api: Recorder, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unreachable daemon and a key still in use are retried with the same key; a 4xx
    refusal is not retried and exits with its code."""
    busy = ApiFailure(1, "409: in use", {"code": "idempotency_key_in_use"})
    api.answers = [ApiFailure(UNAVAILABLE, "cannot reach"), busy, ANSWER]
    assert main(["delayed", "add", "--subject", "mq.tasks.work", "--in", "5m"]) == 0
    keys = {call["headers"]["Idempotency-Key"] for call in api.calls}
    assert len(api.calls) == 3 and len(keys) == 1
    api.calls.clear()
    api.answers = [ApiFailure(2, "422: subject: refused", {"code": "target_refused"})]
    assert main(["delayed", "add", "--subject", "mq.delay.x", "--in", "5m"]) == 2
    assert len(api.calls) == 1 and "422: subject: refused" in capsys.readouterr().err


def test_backfill_sends_the_window_and_prints_a_summary_and_table(
    api: Recorder, capsys: pytest.CaptureFixture[str]
) -> None:
    """`schedules backfill NAME --from --to` posts the window under a key and prints how many
    occurrences fired and which were already fired."""
    items = [
        {"scheduled_for": "2026-11-26T10:00:00Z", "status": "already_fired", "msg_id": "a"},
        {"scheduled_for": "2026-11-26T11:00:00Z", "status": "fired", "msg_id": "b", "seq": 9},
    ]
    api.answers = [
        {"name": "hourly", "status": "backfilled", "occurrences": 2, "fired": 1,
         "already_fired": 1, "items": items}
    ]  # fmt: skip
    argv = ["schedules", "backfill", "hourly", "--from", "2026-11-26T10:00Z"]
    assert main([*argv, "--to", "2026-11-26T12:00Z"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("hourly: 2 occurrences in [2026-11-26T10:00:00+00:00, ")
    assert "fired 1, already fired 1" in out and "hourly" in out
    assert re.search(r"^2026-11-26T11:00:00\S*\s+fired\s+b\s+9$", out, re.M), out
    call = api.calls[0]
    assert call["path"] == "/v1/schedules/hourly/backfill"
    assert call["body"] == {
        "from": "2026-11-26T10:00:00+00:00",
        "to": "2026-11-26T12:00:00+00:00",
        "dry_run": False,
    }
    assert "Idempotency-Key" in call["headers"]


def test_backfill_refuses_a_window_that_ends_before_it_starts(
    api: Recorder, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--from` at or after `--to` exits 2 naming the options, with no request."""
    argv = ["schedules", "backfill", "hourly", "--from", "2026-11-26T12:00Z"]
    assert main([*argv, "--to", "2026-11-26T12:00Z"]) == 2
    assert "--from must be before --to" in capsys.readouterr().err and api.calls == []
