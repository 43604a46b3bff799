"""The drift audit on generated logs with planted truth: exact counts and percentiles through
JSON lines and Parquet, a DST day, the output files, and the exit codes."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from tests.spark.conftest import AuditRun, audit_synth, run_audit
from tests.support.synth import JobPlan, Rates, Synth, generate

pytestmark = pytest.mark.spark

DAY = date(2026, 11, 21)
COUNTS = ("expected", "fired", "missed", "doubled", "early", "late", "unexpected", "manual")


def assert_matches_truth(summary: dict[str, Any], truth: dict[str, Any]) -> None:
    """Every schedule's and subject's counts and lateness percentiles equal the planted ones."""
    assert set(summary["schedules"]) == set(truth["schedules"])
    for name, want in truth["schedules"].items():
        got = summary["schedules"][name]
        assert {c: got[c] for c in COUNTS} == {c: want.get(c, 0) for c in COUNTS}, name
        assert_lateness(got["lateness_ms"], want["lateness_ms"], name)
    for name, want in truth["subjects"].items():
        got = summary["subjects"][name]
        for count in ("fired", "missed", "doubled", "early", "late", "overdue", "dead", "manual"):
            assert got[count] == want.get(count, 0), (name, count)
        assert_lateness(got["lateness_ms"], want["lateness_ms"], name)
    for kind, want in truth["kinds"].items():
        got = summary["totals"][kind]
        wanted = (want.get("expected", 0), want.get("fired", 0), want.get("manual", 0))
        assert (got["expected"], got["fired"], got["manual"]) == wanted, kind


def assert_lateness(got: dict[str, Any], want: dict[str, Any], name: str) -> None:
    for key in ("p50", "p95", "p99", "max", "mean"):
        if want[key] is None:
            assert got[key] is None, (name, key)
        else:
            assert got[key] == pytest.approx(want[key], abs=1e-3), (name, key)


@pytest.fixture(scope="module")
def synth() -> Synth:
    return generate(DAY, jobs=14, tasks=3000, seed=7, rates=Rates(0.02, 0.01, 0.005, 0.02))


@pytest.fixture(scope="module")
def written(synth: Synth, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("log")
    synth.write_parquet(folder / "parquet", files=2)
    synth.write_jsonl(folder / "jsonl", junk_lines=1, files=2)
    synth.write_schedules(folder / "schedules")
    return folder


@pytest.fixture(scope="module")
def parquet_run(spark: Any, written: Path, tmp_path_factory: pytest.TempPathFactory) -> AuditRun:
    out = tmp_path_factory.mktemp("out-parquet")
    return run_audit(
        out,
        "--date",
        DAY.isoformat(),
        "--input",
        str(written / "parquet"),
        "--schedules",
        str(written / "schedules"),
    )


def test_parquet_log_gives_the_planted_counts_and_percentiles(
    parquet_run: AuditRun, synth: Synth
) -> None:
    """Audited from Parquet, every schedule, subject and kind has exactly the planted counts and
    exact lateness percentiles; outside-window and invalid records are left out and counted."""
    assert parquet_run.code == 0, parquet_run.stderr
    summary = parquet_run.summary
    assert_matches_truth(summary, synth.truth)
    assert summary["input"]["records"] == len(synth)
    assert summary["input"]["outside_window"] == 2
    assert summary["input"]["invalid_reasons"] == {
        "kind is neither cron nor delayed": 1,
        "no key": 1,
    }
    assert summary["date"] == DAY.isoformat() and summary["expected_from"].endswith("schedules")


def test_json_lines_give_the_same_summary_as_parquet(
    spark: Any, written: Path, parquet_run: AuditRun, tmp_path: Path
) -> None:
    """The same log as JSON lines (plus a line that is not JSON) gives the same summary, with
    the broken line counted as invalid."""
    run = run_audit(
        tmp_path,
        "--date",
        DAY.isoformat(),
        "--input",
        str(written / "jsonl"),
        "--schedules",
        str(written / "schedules"),
    )
    assert run.code == 0, run.stderr
    got, want = run.summary, parquet_run.summary
    assert got["input"]["invalid_reasons"].pop("not a JSON record") == 1
    got["input"]["invalid"] -= 1
    got["input"]["records"] -= 1
    assert got == want


def test_outputs_are_written_and_the_slo_verdict_follows_the_planted_faults(
    parquet_run: AuditRun, synth: Synth, spark: Any
) -> None:
    """Parquet tables per occurrence, schedule, subject and hour, summary.json and a report
    whose first section is the SLO verdict naming the breaching jobs."""
    out = parquet_run.out
    occ = spark.read.parquet(str(out / "occurrences"))
    missed = occ.filter("kind = 'cron' AND missed").count()
    assert missed == sum(s.get("missed", 0) for s in synth.truth["schedules"].values())
    assert spark.read.parquet(str(out / "schedules")).count() == len(synth.truth["schedules"])
    assert spark.read.parquet(str(out / "subjects")).count() == len(synth.truth["subjects"])
    hours = {(r["hour"], r["kind"]): r for r in spark.read.parquet(str(out / "hours")).collect()}
    for label, want in synth.truth["hours"].items():
        hour = int(label.split()[0])
        assert hours[(hour, "cron")]["expected"] == want["expected"], label
        assert hours[(hour, "cron")]["missed"] == want["missed"], label
    summary = parquet_run.summary
    assert not summary["slo"]["ok"]
    faulty = {n for n, s in synth.truth["schedules"].items() if s["missed"] or s["doubled"]}
    assert faulty <= set(summary["slo"]["breaches"])
    html = (out / "report.html").read_text()
    assert html.index("SLO breached") < html.index("Worst offenders") < html.index("Schedules</h2>")
    assert html.count("data:image/png;base64,") == 2
    assert f"{len(synth):,}" in html  # the audit's own inputs: the record count
    run = json.loads((out / "run.json").read_text())
    assert run["master"].startswith("local") and run["seconds"] > 0


def test_fail_on_slo_exits_1_on_a_breach_and_0_when_met(spark: Any, tmp_path: Path) -> None:
    """--fail-on-slo: exit 1 when a job misses runs, 0 on a clean log; without it always 0."""
    clean = generate(
        DAY,
        jobs=[JobPlan("tidy", "mq.scheduled.t", "*/10 * * * *")],
        tasks=50,
        rates=Rates(0, 0, 0, 0),
        edge_records=False,
    )
    faulty = generate(
        DAY,
        jobs=[JobPlan("tidy", "mq.scheduled.t", "*/10 * * * *")],
        tasks=50,
        rates=Rates(missed=0.2, doubled=0, early=0, late=0),
        edge_records=False,
        seed=3,
    )
    codes = {}
    for name, synth in (("clean", clean), ("faulty", faulty)):
        for flag in ((), ("--fail-on-slo",)):
            run = audit_synth(synth, tmp_path / f"{name}{len(flag)}", *flag)
            codes[(name, bool(flag))] = run.code
            assert ("SLO met" in run.stdout) == (name == "clean"), run.stdout
    assert codes == {
        ("clean", False): 0,
        ("clean", True): 0,
        ("faulty", False): 0,
        ("faulty", True): 1,
    }


def test_p99_above_the_slo_is_a_breach_with_its_reason(spark: Any, tmp_path: Path) -> None:
    """A job whose p99 lateness exceeds --slo-p99-ms breaks the SLO and says by how much."""
    slow = generate(
        DAY,
        jobs=[JobPlan("slow", "mq.scheduled.s", "*/5 * * * *")],
        tasks=0,
        rates=Rates(missed=0, doubled=0, early=0, late=0.5),
        edge_records=False,
    )
    run = audit_synth(slow, tmp_path, "--slo-p99-ms", "500", "--fail-on-slo")
    assert run.code == 1
    reasons = run.summary["slo"]["reasons"]
    assert reasons["slow"][0].startswith("lateness p99 ") and "> 500 ms" in reasons["slow"][0]
    assert run.summary["schedules"]["slow"]["late"] == slow.truth["schedules"]["slow"]["late"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--date", "2026-13-01"], "--date: '2026-13-01' is not a date"),
        (["--date", "21.11.2026"], "--date: '21.11.2026' is not a date"),
        (["--date", "2026-11-21", "--input", "/nonexistent/log"], "does not exist"),
        (["--date", "2026-11-21", "--late-ms", "-5"], "--late-ms: must not be negative"),
        (["--date", "2026-11-21", "--from", "2026-11-22T01:00Z"], "--from: "),
        (["--date", "2026-11-21", "--partitions", "0"], "--partitions: 0 is not between 1 and"),
        (["--date", "2026-11-21", "--partitions", "4097"], "--partitions: 4097 is not between"),
        (["--date", "2026-11-21", "--handover-margin", "soon"], "--handover-margin: 'soon' is"),
    ],
)
def test_bad_options_exit_2_with_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    """An unknown date format, a missing path, a bad number, a partition count out of range or
    a margin that is no duration exits 2 with one line naming it."""
    (tmp_path / "schedules").mkdir()
    (tmp_path / "log.jsonl").write_text("")
    base = {"--input": str(tmp_path / "log.jsonl"), "--schedules": str(tmp_path / "schedules")}
    for option, value in base.items():
        if option not in args:
            args = [*args, option, value]
    run = run_audit(tmp_path / "out", *args)
    assert run.code == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], run.stderr


def test_a_log_with_the_wrong_columns_exits_2_naming_them(spark: Any, tmp_path: Path) -> None:
    """JSON lines and Parquet whose records lack the log's columns exit 2 with one line that
    names the missing columns."""
    (tmp_path / "schedules").mkdir()
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "log.jsonl").write_text('{"job": "x", "when": "2026-11-21T00:00:00Z"}\n')
    spark.createDataFrame([("x", "cron")], "job string, kind string").write.parquet(
        str(tmp_path / "parquet")
    )
    for folder in ("json", "parquet"):
        run = run_audit(
            tmp_path / f"out-{folder}",
            "--date",
            "2026-11-21",
            "--input",
            str(tmp_path / folder),
            "--schedules",
            str(tmp_path / "schedules"),
        )
        lines = run.stderr.strip().splitlines()
        assert run.code == 2, run.stderr
        assert len(lines) == 1 and "'key', 'subject', 'scheduled_for', 'fired_at'" in lines[0]
        assert lines[0].startswith("scheduler audit: --input: ") and "no column" in lines[0]


def test_out_may_be_a_url_spark_writes(spark: Any, written: Path, tmp_path: Path) -> None:
    """--out as a URL (file:// here, s3a:// in production): tables through Spark, summary.json,
    run.json and report.html through Hadoop's FileSystem, Spark's log in a local temp dir."""
    url = f"file://{tmp_path}/reports/day"
    run = run_audit(
        Path("unused"),
        "--date",
        DAY.isoformat(),
        "--input",
        str(written / "parquet"),
        "--schedules",
        str(written / "schedules"),
        "--out",
        url,
    )
    assert run.code == 0, run.stderr
    out = tmp_path / "reports" / "day"
    assert json.loads((out / "summary.json").read_text())["date"] == DAY.isoformat()
    assert (out / "report.html").read_text().startswith("<!doctype html>")
    assert (out / "occurrences").is_dir() and (out / "run.json").is_file()
    assert not (out / "spark.log").exists()
    assert f"report {url}/report.html" in run.stdout
