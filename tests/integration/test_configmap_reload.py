"""The chart's `schedules.reload: live`: the kubelet updates a mounted ConfigMap by swapping a
symlink, and the leading daemon reloads the jobs without a signal or a restart."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import nats

from scheduler.settings import Settings
from tests.integration.test_cron_firing import EVERY_SECOND, stream_count
from tests.support.helpers import DaemonRunner, wait_until


def project(mount: Path, version: str, files: dict[str, str]) -> None:
    """Write `files` the way the kubelet's atomic writer does: a timestamped folder, `..data`
    pointing at it (swapped by a rename), and each file a symlink through `..data`."""
    folder = mount / f"..{version}"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    (mount / "..data_tmp").symlink_to(folder.name)
    os.replace(mount / "..data_tmp", mount / "..data")
    for name in files:
        if not (mount / name).is_symlink():
            (mount / name).symlink_to(Path("..data") / name)


async def test_a_configmap_update_is_reloaded_live(settings: Settings) -> None:
    """A job that appears through a ConfigMap-style symlink swap starts firing within seconds,
    with no SIGHUP."""
    nc = await nats.connect(settings.nats_servers)
    await nc.jetstream().add_stream(name="JOBS", subjects=["mq.scheduled.>"], duplicate_window=120)
    await nc.close()
    mount = settings.schedules_dir
    project(mount, "2026_11_25_08_00_00.1", {"jobs.yaml": "scheduled_jobs: []\n"})
    runner = DaemonRunner(settings)
    daemon = await runner.start()
    try:
        await wait_until(lambda: bool(daemon.leadership and daemon.leadership.role == "leader"), 10)
        await asyncio.sleep(1.2)
        assert await stream_count(settings.nats_url or "") == 0
        project(mount, "2026_11_25_08_01_00.2", {"jobs.yaml": "scheduled_jobs:\n" + EVERY_SECOND})
        async with asyncio.timeout(8):
            while await stream_count(settings.nats_url or "") == 0:  # noqa: ASYNC110 (server state)
                await asyncio.sleep(0.2)
    finally:
        await runner.stop()
