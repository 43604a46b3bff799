"""Alembic runs in a daemon thread (scheduler/daemon/migrate.py, `_daemon_thread`): its outcome
reaches the loop, and a migration that never ends cannot keep a stopped process alive (an edge
stopped while migrating once lived on after its `scheduler run` had exited)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

from scheduler.daemon import migrate


async def test_the_result_and_the_error_reach_the_loop() -> None:
    seen: list[tuple[str, ...]] = []
    await migrate._daemon_thread(lambda *a: seen.append(a), "dsn", "head", "mq-scheduler-migrate-a")
    assert seen == [("dsn", "head", "mq-scheduler-migrate-a")]

    def fails(*_: str) -> None:
        raise ValueError("permission denied for schema public")

    with pytest.raises(ValueError, match="permission denied"):
        await migrate._daemon_thread(fails, "dsn", "head", "mq-scheduler-migrate-b")


async def test_the_thread_is_a_daemon_named_for_its_session() -> None:
    release = threading.Event()

    def held(*_: str) -> None:
        release.wait(5)

    job = migrate._daemon_thread(held, "dsn", "head", "mq-scheduler-migrate-c")
    (thread,) = [t for t in threading.enumerate() if t.name == "mq-scheduler-migrate-c"]
    assert thread.daemon
    release.set()
    await job


def test_a_process_whose_migration_never_ends_still_exits() -> None:
    """asyncio.run waits for its default executor's threads at close; this thread is not one."""
    code = textwrap.dedent(
        """
        import asyncio, threading
        from scheduler.daemon import migrate

        async def main():
            job = migrate._daemon_thread(
                lambda *_: threading.Event().wait(), "dsn", "head", "mq-scheduler-migrate-d"
            )
            await asyncio.sleep(0.05)
            assert not job.done()

        asyncio.run(main())
        print("exited")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.strip() == "exited", done.stderr
