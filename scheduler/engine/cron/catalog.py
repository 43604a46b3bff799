"""The cron jobs this leader fires: the YAML loaded, synced to the repository, reloaded on change.

YAML is the source of truth (docs/cron.md): a sync upserts the valid jobs and deactivates
those gone from the files; errors are logged and kept for `/readyz`, and the valid jobs still
run. A reload is due on SIGHUP (`request_reload`) or when a file's modification time changes.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from scheduler.clock import Clock
from scheduler.cron.jobs import Job, load_dir, schedule_files
from scheduler.engine.ports import ScheduleRepository

log = logging.getLogger(__name__)


class CronCatalog:
    """The jobs as last synced: `jobs` (operator pauses and failed jobs held as paused),
    `errors` (the YAML's, as text), `paused_by_operator`, `failed` (jobs stopped by a permanent
    publish error), and `synced_at` (where a new job's cursor starts)."""

    def __init__(self, directory: Path, store: ScheduleRepository, clock: Clock) -> None:
        self.directory = Path(directory)
        self.store = store
        self.clock = clock
        self.jobs: tuple[Job, ...] = ()
        self.errors: list[str] = []
        self.paused_by_operator: frozenset[str] = frozenset()  # applied at the last sync
        self.failed: frozenset[str] = frozenset()
        self.synced_at: datetime | None = None
        self.reload_requested = asyncio.Event()
        self._stamp: tuple[tuple[str, float], ...] = ()

    def request_reload(self) -> None:
        """Ask for a YAML reload (SIGHUP)."""
        self.reload_requested.set()

    def stale(self) -> bool:
        """A reload was asked for, or a YAML file changed since the last sync."""
        return self.reload_requested.is_set() or self._files_stamp() != self._stamp

    async def sync(self) -> None:
        """Load the YAML (keeping the valid jobs, logging the errors) and sync it to the store."""
        self._stamp = self._files_stamp()
        loaded_jobs, self.errors = self._load()
        for error in self.errors:
            log.error("cron.yaml_error %s", error)
        synced_at = self.clock.now()
        changed, removed = await self.store.sync(loaded_jobs, synced_at)
        paused, failed = await self.store.operator_paused(), await self.store.failed()
        # assigned together, with no await between: a reader never sees a pause or a failure
        # that the jobs do not carry yet
        self.synced_at = synced_at
        self.paused_by_operator, self.failed = paused, failed
        self.jobs = operator_paused(loaded_jobs, paused | failed)
        log.info(
            "cron.synced jobs=%d changed=%d removed=%d errors=%d",
            len(loaded_jobs),
            changed,
            removed,
            len(self.errors),
        )

    def halt(self, names: frozenset[str]) -> None:
        """Stop firing jobs just marked failed: held like paused ones (their cursors move on, so
        a fixed definition starts at its next occurrence, not with a replay)."""
        if names:
            self.failed |= names
            self.jobs = operator_paused(self.jobs, names)

    def _files_stamp(self) -> tuple[tuple[str, float], ...]:
        try:
            return tuple((str(p), p.stat().st_mtime) for p in schedule_files(self.directory))
        except (NotADirectoryError, FileNotFoundError, OSError):
            return ()

    def _load(self) -> tuple[tuple[Job, ...], list[str]]:
        if not self.directory.is_dir():
            return (), [f"{self.directory}: not a directory"]
        loaded = load_dir(self.directory)
        return loaded.jobs, [str(e) for e in loaded.errors]


def operator_paused(jobs: tuple[Job, ...], names: frozenset[str]) -> tuple[Job, ...]:
    """The jobs with those an operator paused (management API) marked paused."""
    return tuple(replace(j, paused=True) if j.name in names else j for j in jobs)
