"""Cron jobs through the management API on a running daemon: fires with their lateness, a pause
that stops firing and survives a restart. The list, the detail and a trigger run on the twins:
tests/unit/test_schedules_api.py."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.integration.api.harness import READ, ApiHarness, poll
from tests.support.helpers import wait_until


async def _synced(api: ApiHarness) -> None:
    """Wait until the leader has synced the YAML into PostgreSQL."""

    async def names() -> list[str]:
        r = await api.call("GET", "/v1/schedules", token=READ)
        return [j["name"] for j in r.body["items"]]

    await poll(names, lambda n: len(n) == 3)


async def test_fires_show_lateness_and_pause_stops_firing_until_resume(api: ApiHarness) -> None:
    """The detail lists recent fires with their lateness; a paused job stops firing (and says
    who paused it), a resumed one fires again; YAML's own pause cannot be resumed here."""
    await api.start()
    await _synced(api)

    async def fires() -> list[dict[str, Any]]:
        r = await api.call("GET", "/v1/schedules/every-second", token=READ)
        return list(r.body["fires"])

    recent = await poll(fires, lambda f: len(f) >= 2)
    assert all(0 <= f["lateness_ms"] < 5000 and not f["manual"] for f in recent)
    assert recent[0]["scheduled_for"] > recent[1]["scheduled_for"]  # newest first
    r = await api.call("POST", "/v1/schedules/every-second/pause")
    assert r.status == 200 and r.body == {"name": "every-second", "status": "paused"}
    daemon = api.daemon
    assert daemon is not None and daemon.cron is not None
    cron = daemon.cron
    await wait_until(lambda: "every-second" in cron.paused_by_operator, within=3)
    await asyncio.sleep(0.3)  # an occurrence in flight when the pause landed may still record
    count = len(await fires())
    await asyncio.sleep(2.2)
    assert len(await fires()) == count, "a paused job fired"
    shown = (await api.call("GET", "/v1/schedules/every-second", token=READ)).body
    assert shown["paused"] and not shown["paused_in_yaml"]
    assert shown["paused_by"].startswith("admin@")
    r = await api.call("POST", "/v1/schedules/every-second/resume")
    assert r.status == 200 and r.body["status"] == "resumed"
    await poll(fires, lambda f: len(f) >= min(count + 2, 20), within=5)
    r = await api.call("POST", "/v1/schedules/frozen/resume")
    assert r.status == 409 and r.body["code"] == "paused_in_yaml"
    assert "jobs.yaml:" in r.body["detail"]


async def test_pause_survives_a_restart(api: ApiHarness) -> None:
    """An operator's pause is kept in PostgreSQL: a restarted leader applies it at once."""
    await api.start()
    await _synced(api)
    assert (await api.call("POST", "/v1/schedules/every-second/pause")).status == 200
    await api.stop()
    daemon = await api.start()
    cron = daemon.cron
    assert cron is not None
    await wait_until(lambda: "every-second" in cron.paused_by_operator, within=5)
    assert next(j for j in cron.jobs if j.name == "every-second").paused
