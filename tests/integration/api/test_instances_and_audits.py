"""`/v1/instances` (leader and standbys from their heartbeats) and `/v1/audits` (the drift
audit's runs): what the console's overview and drift page read. The YAML problems
`/v1/schedules` reports (the console's banner) are checked on the twins
(tests/unit/test_schedules_api.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.integration.api.harness import READ, ApiHarness, poll
from tests.support.helpers import DaemonRunner


async def test_instances_list_the_leader_and_a_standby_until_it_stops(api: ApiHarness) -> None:
    """Both instances show with role, epoch and since when, the leader first; a standby that
    stops leaves the list."""
    await api.start()
    standby = DaemonRunner(api.settings.with_overrides(instance_id="test-2"))
    await standby.start()
    try:

        async def listed() -> list[dict[str, Any]]:
            return list((await api.call("GET", "/v1/instances", token=READ)).body["items"])

        both = await poll(listed, lambda items: len(items) == 2, within=10)
        assert [(i["instance"], i["role"]) for i in both] == [
            ("test-1", "leader"),
            ("test-2", "standby"),
        ]
        assert both[0]["epoch"] is not None and both[0]["since"] is not None
        assert not any(i["stale"] for i in both)
    finally:
        await standby.stop()
    alone = await poll(listed, lambda items: len(items) == 1, within=10)
    assert alone[0]["instance"] == "test-1"
    assert (await api.call("GET", "/v1/instances", token=None)).status == 401


async def test_audit_runs_summary_and_report_are_read_from_the_audit_folder(
    api: ApiHarness, tmp_path: Path
) -> None:
    """The runs are listed newest first, a run's summary.json comes back as written, its
    report.html is served in a sandbox, and a missing run or folder says which."""
    root = tmp_path / "audit"
    for day, ok in (("2026-11-20", True), ("2026-11-21", False)):
        (root / day).mkdir(parents=True)
        (root / day / "summary.json").write_text(json.dumps({"date": day, "slo": {"ok": ok}}))
    (root / "2026-11-21" / "report.html").write_text("<h1>report</h1>")
    await api.start(audit_dir=root)
    listing = (await api.call("GET", "/v1/audits", token=READ)).body
    assert listing["configured"] and [r["run"] for r in listing["items"]] == [
        "2026-11-21",
        "2026-11-20",
    ]
    run = (await api.call("GET", "/v1/audits/2026-11-21", token=READ)).body
    assert run == {"run": "2026-11-21", "has_report": True, "summary": {
        "date": "2026-11-21", "slo": {"ok": False}}}  # fmt: skip
    async with api.http.get(
        api.url + "/v1/audits/2026-11-21/report", headers={"Authorization": f"Bearer {READ}"}
    ) as resp:
        assert resp.status == 200 and await resp.text() == "<h1>report</h1>"
        assert resp.headers["Content-Security-Policy"].startswith("sandbox;")
    missing = await api.call("GET", "/v1/audits/2026-11-20/report", token=READ)
    assert missing.status == 404 and "report.html" in missing.body["detail"]
    assert (await api.call("GET", "/v1/audits/2026-11-21", token=None)).status == 401
    await api.stop()
    await api.start()
    unset = await api.call("GET", "/v1/audits/2026-11-21", token=READ)
    assert unset.status == 404 and "SCHEDULER_AUDIT_DIR is not set" in unset.body["detail"]
    assert (await api.call("GET", "/v1/audits", token=READ)).body["configured"] is False
