"""Hostile schedules files dropped beside good ones while the daemon runs: the reload reports
each with its file, and the good job keeps firing (nothing else lost, the daemon keeps running)."""

from __future__ import annotations

import asyncio

from tests.integration.test_cron_firing import EVERY_SECOND, Cron, cron, stream_count, write_jobs

__all__ = ["cron"]  # the fixture, used by name below

JOB = "scheduled_jobs:\n  - name: {name}\n    subject: mq.scheduled.{name}\n    cron: '@daily'\n"
BOMB = (
    "l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    + "".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]\n" for i in range(1, 9))
    + JOB.format(name="bomb")
    + "    data: {k: *l8}\n"
)


async def test_a_reload_with_hostile_files_reports_them_and_keeps_firing(cron: Cron) -> None:
    """An alias bomb, a 100 MB file, a `!!python` tag and a 10,000-character cron are each a
    reported error with their file after a reload; the every-second job still fires."""
    folder = cron.settings.schedules_dir
    write_jobs(folder, EVERY_SECOND)
    daemon = await cron.start()
    (folder / "bomb.yaml").write_text(BOMB)
    with (folder / "huge.yaml").open("wb") as f:
        f.truncate(100 * 1024 * 1024)  # sparse: nothing on disk
    (folder / "python.yaml").write_text(
        "scheduled_jobs:\n  - !!python/object/apply:os.system ['touch /tmp/pwned-cron']\n"
    )
    long_cron = "1," * 4999 + "1 * * * *"
    (folder / "cron.yaml").write_text(JOB.format(name="long").replace("'@daily'", f"'{long_cron}'"))
    daemon.reload()
    url = cron.settings.nats_url or ""
    for _ in range(200):  # the cron loop reloads on its next turn
        if len(daemon.cron.errors) >= 4:
            break
        await asyncio.sleep(0.05)
    before = await stream_count(url)
    await asyncio.sleep(2.5)
    assert await stream_count(url) >= before + 2  # the good job kept its once-a-second pace
    errors = daemon.cron.errors
    assert any("bomb.yaml:1: the document expands to more than" in e for e in errors), errors
    assert any("huge.yaml: the file is 104857600 bytes long" in e for e in errors), errors
    assert any("python.yaml:2: YAML syntax error: could not determine" in e for e in errors)
    assert any("cron.yaml:4: long: cron: is 10007 characters long" in e for e in errors)
    assert [job.name for job in daemon.cron.jobs] == ["tick"]
    assert cron.task is not None and not cron.task.done()
