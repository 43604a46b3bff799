"""`scheduler export-log`: a day of fire_log from PostgreSQL as JSON lines or Parquet."""

from __future__ import annotations

import contextlib
import io
import json
from datetime import date
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from scheduler.audit import export
from scheduler.cli.main import main
from tests.support.synth import generate, load_postgres

DAY = date(2026, 11, 21)


@pytest.fixture
async def loaded(database_url: str) -> tuple[str, int]:
    """A database holding a generated day; (URL, records the export must return)."""
    synth = generate(DAY, jobs=5, tasks=700, seed=2)
    await load_postgres(database_url, synth)
    # the generator's two edge records are outside the window, two more are invalid
    return database_url, len(synth) - 4


def export_log(url: str, monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str, str]:
    monkeypatch.setenv("SCHEDULER_DATABASE_URL", url)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["export-log", "--date", DAY.isoformat(), *args])
    return code, out.getvalue(), err.getvalue()


def test_jsonl_export_holds_the_days_records_in_the_design_format(
    loaded: tuple[str, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each line is one record with the design's fields, times as RFC 3339 UTC milliseconds;
    records outside the day (and its grace) are left out; batches stream through."""
    url, count = loaded
    monkeypatch.setattr(export, "FETCH", 97)  # many small fetches: the streaming path
    code, _, err = export_log(url, monkeypatch, "--out", str(tmp_path / "day.jsonl"))
    assert code == 0, err
    lines = (tmp_path / "day.jsonl").read_text().splitlines()
    assert len(lines) == count and f"{count:,} records" in err
    first = json.loads(lines[0])
    fields = ["kind", "key", "subject", "scheduled_for", "fired_at", "attempt", "epoch"]
    assert list(first) == [*fields, "instance", "stream", "stream_seq", "manual"]
    for line in lines:
        doc = json.loads(line)
        assert doc["kind"] in ("cron", "delayed")
        assert doc["scheduled_for"].startswith("2026-11-21T") and doc["scheduled_for"][-5] == "."
        assert len(doc["fired_at"]) == 24 and doc["fired_at"].endswith("Z")
    assert not any(json.loads(ln)["key"] == "task-too-late" for ln in lines)


def test_parquet_export_equals_the_jsonl_one(
    loaded: tuple[str, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Parquet export holds the same records (several row groups when large)."""
    url, count = loaded
    monkeypatch.setattr(export, "ROW_GROUP", 500)
    monkeypatch.setattr(export, "FETCH", 97)
    code, _, err = export_log(
        url, monkeypatch, "--out", str(tmp_path / "day.parquet"), "--format", "parquet"
    )
    assert code == 0, err
    table = pq.read_table(tmp_path / "day.parquet")
    assert table.num_rows == count
    assert pq.ParquetFile(tmp_path / "day.parquet").num_row_groups > 1
    assert str(table.schema.field("fired_at").type) == "timestamp[us, tz=UTC]"
    code, out, _ = export_log(url, monkeypatch, "--out", "-")
    keys = sorted((json.loads(ln)["key"], json.loads(ln)["fired_at"]) for ln in out.splitlines())
    rows = table.to_pylist()
    from_parquet = sorted(
        (
            r["key"],
            r["fired_at"].strftime("%Y-%m-%dT%H:%M:%S.")
            + f"{r['fired_at'].microsecond // 1000:03d}Z",
        )
        for r in rows
    )
    assert keys == from_parquet


def test_export_without_a_database_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without SCHEDULER_DATABASE_URL export-log exits 2 and says which variable to set."""
    monkeypatch.delenv("SCHEDULER_DATABASE_URL", raising=False)
    monkeypatch.delenv("SCHEDULER_CONFIG", raising=False)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["export-log", "--date", "2026-11-21", "--out", str(tmp_path / "x.jsonl")])
    assert code == 2
    assert "SCHEDULER_DATABASE_URL" in err.getvalue()
