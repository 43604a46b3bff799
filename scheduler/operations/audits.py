"""The drift audit's reports, read from `SCHEDULER_AUDIT_DIR` for the API and the console.

The audit (`scheduler audit --out DIR`, docs/drift-audit.md) writes one folder per run, holding
`summary.json` and `report.html`; the Helm chart's CronJob writes `<audit dir>/<day>`. A run is
named by its folder. Names are checked against a strict pattern and the resolved path must stay
a direct child of the audit folder (a symbolic link pointing elsewhere is refused), so no request
can read outside it. Runs are ordered by their day (the folder's name when it is `YYYY-MM-DD`,
else the day `summary.json` was written), then by when it was written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from scheduler.operations.records import AuditRun, AuditRuns

RUN_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
SUMMARY = "summary.json"
REPORT = "report.html"
MAX_SUMMARY_BYTES = 16 << 20
MAX_REPORT_BYTES = 64 << 20
_RUN = re.compile(RUN_NAME)
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


class AuditUnreadableError(ValueError):
    """A run's file exists but cannot be used (too large, not JSON, unreadable)."""

    def __init__(self, run: str, detail: str) -> None:
        super().__init__(f"audit run {run!r}: {detail}")
        self.run = run


@dataclass(frozen=True, slots=True)
class AuditReports:
    """The runs under one audit folder (`directory` None: the setting is not set)."""

    directory: Path | None

    def listing(self, limit: int) -> AuditRuns:
        """Whether a folder is configured, why it cannot be read, and the newest `limit` runs,
        newest first."""
        if self.directory is None:
            return AuditRuns(configured=False, problem=None, items=[])
        if not self.directory.is_dir():
            problem = f"SCHEDULER_AUDIT_DIR: {self.directory} is not a readable folder"
            return AuditRuns(configured=True, problem=problem, items=[])
        runs = [run for child in self._children() if (run := self._describe(child))]
        runs.sort(key=lambda r: (r.day, r.written_at), reverse=True)
        return AuditRuns(configured=True, problem=None, items=runs[:limit])

    def summary(self, run: str) -> dict[str, Any] | None:
        """The run's `summary.json` as written, or None when there is no such run."""
        path = self._file(run, SUMMARY)
        if path is None:
            return None
        raw = _read(path, MAX_SUMMARY_BYTES, run)
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise AuditUnreadableError(run, f"{SUMMARY} is not JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise AuditUnreadableError(run, f"{SUMMARY} is not a JSON object")
        return doc

    def has_report(self, run: str) -> bool:
        return self._file(run, REPORT) is not None

    def report(self, run: str) -> bytes | None:
        """The run's `report.html` bytes, or None when the run or its report is missing."""
        path = self._file(run, REPORT)
        return None if path is None else _read(path, MAX_REPORT_BYTES, run)

    # -- confinement -----------------------------------------------------------------------------
    def _children(self) -> list[Path]:
        assert self.directory is not None
        try:
            return [p for p in self.directory.iterdir() if _RUN.match(p.name)]
        except OSError:
            return []

    def _run_dir(self, run: str) -> Path | None:
        if self.directory is None or not _RUN.match(run):
            return None
        root = self.directory.resolve()
        path = (root / run).resolve()
        return path if path.parent == root and path.is_dir() else None

    def _file(self, run: str, name: str) -> Path | None:
        folder = self._run_dir(run)
        if folder is None:
            return None
        path = (folder / name).resolve()
        return path if path.parent == folder and path.is_file() else None

    def _describe(self, child: Path) -> AuditRun | None:
        summary = self._file(child.name, SUMMARY)
        if summary is None:
            return None
        try:
            written = datetime.fromtimestamp(summary.stat().st_mtime, UTC)
        except OSError:
            return None
        day = child.name if _DAY.fullmatch(child.name) else written.date().isoformat()
        return AuditRun(
            run=child.name, day=day, written_at=written, has_report=self.has_report(child.name)
        )


def _read(path: Path, limit: int, run: str) -> bytes:
    try:
        size = path.stat().st_size
        if size > limit:
            raise AuditUnreadableError(run, f"{path.name} is {size} bytes, over {limit}")
        return path.read_bytes()
    except OSError as exc:
        raise AuditUnreadableError(run, f"{path.name} cannot be read ({exc.strerror})") from None
