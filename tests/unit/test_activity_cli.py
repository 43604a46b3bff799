"""`scheduler activity` and `schedules pause --note` build the right API calls and print the
log as a table; the activity log's detail is bounded whatever a request carried."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from scheduler.cli import ops
from scheduler.cli.apiclient import ApiClient
from scheduler.cli.main import main
from scheduler.operations.activity import DETAIL_KEYS, DETAIL_TEXT, bounded

PAGE = {
    "items": [
        {
            "id": 7, "at": "2026-11-26T14:05:09.123456Z", "who": "admin@10.0.0.7",
            "via": "console", "session": "admin-3f2a9c", "action": "pause",
            "route": "POST /v1/schedules/{name}/pause", "target": "nightly",
            "detail": {"note": "vendor down"}, "http_status": 200, "outcome": "paused",
            "request_id": "r7", "idempotency_key": None,
        },
        {
            "id": 6, "at": "2026-11-26T14:01:00Z", "who": "admin@127.0.0.1", "via": "api",
            "session": None, "action": "cancel", "route": "DELETE /v1/delayed/{task_id}",
            "target": "t-1", "detail": {}, "http_status": 404, "outcome": "not_found",
            "request_id": "r6", "idempotency_key": "k",
        },
    ],
    "next_cursor": "CUR",
}  # fmt: skip


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, dict[str, Any], Any]]:
    """Every API call the CLI makes, answered with PAGE (or `{"status": "paused"}`)."""
    seen: list[tuple[str, str, dict[str, Any], Any]] = []

    def call(self: ApiClient, method: str, path: str, query: Any = None, body: Any = None) -> Any:
        seen.append((method, path, dict(query or {}), body))
        return PAGE if path == "/v1/activity" else {"name": "nightly", "status": "paused"}

    monkeypatch.setattr(ApiClient, "call", call)
    return seen


def test_activity_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    """`scheduler activity --help` prints its usage with every filter and exits 0."""
    with pytest.raises(SystemExit) as info:
        main(["activity", "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and "usage: scheduler activity" in out
    for option in ("--action", "--target", "--who", "--since", "--until", "--limit", "--json"):
        assert option in out


def test_activity_sends_the_filters_and_prints_a_table(
    calls: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The filters go to GET /v1/activity (`--since 1h`: an instant an hour ago); the table
    shows when (to the second), who (console session marked), action, target, outcome with
    its status, the detail, and how to get the next page."""
    argv = ["activity", "--action", "pause", "--target", "nightly", "--since", "1h"]
    assert main([*argv, "--limit", "5", "--url", "http://api.test"]) == 0
    [(method, path, query, body)] = calls
    assert (method, path, body) == ("GET", "/v1/activity", None)
    assert query["action"] == "pause" and query["target"] == "nightly" and query["limit"] == 5
    since = datetime.fromisoformat(query["since"])
    assert abs(since - (datetime.now(UTC) - timedelta(hours=1))) < timedelta(seconds=5)
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["AT", "WHO", "ACTION", "TARGET", "OUTCOME", "DETAIL"]
    assert out[1].startswith("2026-11-26T14:05:09.123Z  admin@10.0.0.7 (console admin-3f2a9c)")
    assert "paused (200)" in out[1] and out[1].endswith("note=vendor down")
    assert "cancel" in out[2] and "not_found (404)" in out[2]
    assert out[-1] == "more: --cursor CUR"


def test_activity_json_and_refused_options(
    calls: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """`--json` prints the API's page; a limit out of 1..500 or a time that is neither
    RFC 3339 with an offset nor a duration exits 2 naming it, before any call."""
    assert main(["activity", "--json", "--url", "http://api.test"]) == 0
    assert json.loads(capsys.readouterr().out) == PAGE
    for bad in (["--limit", "0"], ["--limit", "501"], ["--since", "yesterday"],
                ["--until", "2026-11-26T10:00"]):  # fmt: skip
        with pytest.raises(SystemExit) as info:
            main(["activity", *bad, "--url", "http://api.test"])
        assert info.value.code == 2
        assert bad[1] in capsys.readouterr().err
    assert len(calls) == 1


def test_pause_with_a_note_sends_it(calls: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    """`schedules pause NAME --note TEXT` sends `{"note": TEXT}`; without --note no body."""
    assert (
        main(["schedules", "pause", "nightly", "--note", "vendor down", "--url", "http://x"]) == 0
    )
    assert main(["schedules", "pause", "nightly", "--url", "http://x"]) == 0
    assert [(c[1], c[3]) for c in calls] == [
        ("/v1/schedules/nightly/pause", {"note": "vendor down"}),
        ("/v1/schedules/nightly/pause", None),
    ]
    assert capsys.readouterr().out.splitlines() == ["nightly: paused", "nightly: paused"]


def test_schedules_show_and_list_print_the_pause_note() -> None:
    """`schedules show` prints who, when and the note; `schedules list` shows
    `paused: <note>` in STATE, and a job paused in YAML (no note) stays `paused`."""
    job = {
        "name": "nightly", "cron": "30 2 * * *", "timezone": "UTC", "subject": "mq.n",
        "file": "jobs.yaml", "line": 3, "paused": True, "paused_in_yaml": False,
        "paused_by": "admin@10.0.0.7", "paused_at": "2026-11-26T14:00:00Z",
        "pause_note": "vendor down", "failed": False, "last_scheduled_for": None,
        "last_fired_at": None, "next": [], "fires": [], "failed_reason": None,
    }  # fmt: skip

    class Api:
        def call(self, method: str, path: str, query: Any = None) -> Any:
            if path == "/v1/schedules":
                frozen = {**job, "name": "frozen", "pause_note": None, "paused_in_yaml": True}
                return {"items": [job, frozen], "next_cursor": None}
            return job

    args = argparse.Namespace(name="nightly", removed=False, limit=50, cursor=None, all=False)
    _, text, _ = ops._schedule_show(Api(), args)  # type: ignore[arg-type]
    assert "paused         by admin@10.0.0.7 at 2026-11-26T14:00:00.000Z: vendor down" in text
    _, text, _ = ops._schedules_list(Api(), args)  # type: ignore[arg-type]
    lines = text.splitlines()
    assert " paused: vendor down " in lines[1] and lines[2].startswith("frozen")
    assert " paused " in lines[2]


def test_the_detail_is_bounded() -> None:
    """At most DETAIL_KEYS scalar fields, texts cut to DETAIL_TEXT characters, payload-like
    and nested fields left out, instants as RFC 3339, NaN dropped."""
    at = datetime(2026, 11, 26, tzinfo=UTC)
    body = {"note": "n" * 5000, "data": "secret", "org": {"id": 1}, "at": at, "n": float("nan")}
    got = bounded({f"k{i}": i for i in range(40)}, body)
    assert len(got) == DETAIL_KEYS and "data" not in got and "org" not in got and "n" not in got
    small = bounded(body)
    assert len(small["note"]) == DETAIL_TEXT and small["note"].endswith("…")
    assert small["at"] == "2026-11-26T00:00:00+00:00"
