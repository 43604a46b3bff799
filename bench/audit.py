"""Drift-audit throughput: `scheduler audit` on generated logs of 1M, 3M and 10M records.

For each size and format (Parquet, JSON lines) a seeded day of log is generated once (cached
under --data), then `python -m scheduler audit --master local[2]` runs as a subprocess, JVM start
included. The process tree is sampled every 0.25 s: wall time, CPU seconds of the driver
(Python), the JVM (driver and executors in local mode) and the Python workers, peak RSS of each,
and the machine's busy cores (other work on the host shows up there). Baseline in the same run:
a Spark job that only reads every column of the same input once (JVM start + scan), so the
audit's cost shows as a ratio over the floor of any Spark job on that input. Linearity: a
least-squares fit t = a + b*n per format.

    .venv/bin/python bench/audit.py                         # 1M, 3M, 10M; Parquet and JSON lines
    .venv/bin/python bench/audit.py --sizes 1000000 --formats parquet --out bench/results/a.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import psutil
from common import machine_busy_seconds, report

from tests.support.synth import JobPlan, generate

DAY = date(2026, 3, 29)  # a DST day in Europe
PER_JOB = {0: 8640, 1: 1440, 2: 288, 3: 2880}
CRON_SHARE = 0.6
BASELINE = """
import sys, time
from pathlib import Path
from scheduler.audit import session
spark, _ = session.start("local[2]", [], Path(sys.argv[3]) / "spark.log")
reader = spark.read.parquet if sys.argv[1] == "parquet" else spark.read.json
reader(sys.argv[2]).write.format("noop").mode("overwrite").save()
spark.stop()
"""


def bench_jobs(records: int) -> list[JobPlan]:
    """Jobs whose occurrences make about 60 % of `records`: ~30 distinct expressions over
    every-10-seconds, per-minute, every-5-minutes and every-30-seconds cadences, in 3 zones."""
    jobs, total, i = [], 0, 0
    while total < CRON_SHARE * records:
        kind = i % 4
        cron, zone = {
            0: (f"{i % 10}/10 * * * * *", "UTC"),
            1: ("* * * * *", "Europe/Berlin"),
            2: (f"{i % 5}/5 * * * *", "America/New_York"),
            3: (f"{i % 30}/30 * * * * *", "UTC"),
        }[kind]
        jobs.append(JobPlan(f"job-{i:05d}", f"mq.scheduled.s{i % 20}", cron, zone))
        total += PER_JOB[kind]
        i += 1
    return jobs


def dataset(folder: Path, records: int, fmt: str) -> tuple[Path, Path, int]:
    """(log path, schedules dir, record count), generated once and cached."""
    base = folder / f"{records}"
    done = base / f"{fmt}.done"
    if not done.exists():
        jobs = bench_jobs(records)
        cron = sum(PER_JOB[i % 4] for i in range(len(jobs)))
        began = time.monotonic()
        synth = generate(DAY, jobs, tasks=max(0, records - cron), seed=42)
        if fmt == "parquet":
            synth.write_parquet(base / "parquet", files=8)
        else:
            synth.write_jsonl(base / "jsonl", files=8)
        synth.write_schedules(base / "schedules")
        done.write_text(json.dumps({"records": len(synth), "jobs": len(jobs)}))
        print(
            f"audit bench: generated {len(synth):,} records ({fmt}) in "
            f"{time.monotonic() - began:.0f} s",
            file=sys.stderr,
        )
    meta = json.loads(done.read_text())
    return base / ("parquet" if fmt == "parquet" else "jsonl"), base / "schedules", meta["records"]


def measured(command: list[str]) -> dict[str, Any]:
    """Run `command`, sampling its process tree: wall, CPU and peak RSS per role."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    busy0, t0 = machine_busy_seconds(), time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    root = psutil.Process(proc.pid)
    cpu: dict[int, tuple[str, float]] = {}
    peak = {"driver": 0.0, "jvm": 0.0, "workers": 0.0}
    while proc.poll() is None:
        _sample(root, cpu, peak)
        time.sleep(0.25)
    _out, err = proc.communicate()
    wall = time.monotonic() - t0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"audit bench: {' '.join(command[:4])} failed:\n{err.decode()[-2000:]}")
    by_role: dict[str, float] = {"driver": 0.0, "jvm": 0.0, "workers": 0.0}
    for role, seconds in cpu.values():
        by_role[role] += seconds
    busy = machine_busy_seconds() - busy0
    return {
        "wall_seconds": round(wall, 2),
        "cpu_seconds": {k: round(v, 2) for k, v in by_role.items()},
        "cpu_share_of_wall": {k: round(v / wall, 3) for k, v in by_role.items()},
        "peak_rss_mb": {k: round(v) for k, v in peak.items()},
        "machine_busy_cores": round(busy / wall, 2),
        "other_cores": round(max(0.0, busy - sum(by_role.values())) / wall, 2),
        "stderr_tail": err.decode().strip().splitlines()[-4:],
    }


def _sample(root: psutil.Process, cpu: dict[int, tuple[str, float]], peak: dict) -> None:
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    rss = {"driver": 0.0, "jvm": 0.0, "workers": 0.0}
    for p in procs:
        try:
            role = "driver" if p.pid == root.pid else ("jvm" if p.name() == "java" else "workers")
            times = p.cpu_times()
            cpu[p.pid] = (role, times.user + times.system)
            rss[role] += p.memory_info().rss / 2**20
        except psutil.Error:
            continue
    for role, value in rss.items():
        peak[role] = max(peak[role], value)


def fit(points: list[tuple[int, float]]) -> dict[str, float]:
    """Least squares t = a + b*n: fixed seconds a, µs per record b, and R²."""
    n = len(points)
    if n < 2:
        return {}
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    a = my - b * mx
    ss_res = sum((y - a - b * x) ** 2 for x, y in points)
    ss_tot = sum((y - my) ** 2 for _, y in points) or 1e-9
    return {
        "fixed_seconds": round(a, 2),
        "us_per_record": round(b * 1e6, 3),
        "r2": round(1 - ss_res / ss_tot, 4),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000,3000000,10000000")
    parser.add_argument("--formats", default="parquet,jsonl")
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "mqs-audit-bench"))
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    formats = args.formats.split(",")
    data = Path(args.data)
    data.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    work = Path(tempfile.mkdtemp(prefix="mqs-audit-out-"))
    try:
        for fmt in formats:
            for size in sizes:
                log, schedules, records = dataset(data, size, fmt)
                out = work / f"{fmt}-{size}"
                audit = measured(
                    [
                        sys.executable,
                        "-m",
                        "scheduler",
                        "audit",
                        "--date",
                        DAY.isoformat(),
                        "--input",
                        str(log),
                        "--schedules",
                        str(schedules),
                        "--out",
                        str(out),
                        "--master",
                        "local[2]",
                    ]
                )
                summary = json.loads((out / "summary.json").read_text())
                row: dict[str, Any] = {
                    "format": fmt,
                    "records": records,
                    "expected_occurrences": summary["totals"]["cron"]["expected"],
                    "audit": audit,
                    "records_per_second": round(records / audit["wall_seconds"]),
                    "stages_seconds": json.loads((out / "run.json").read_text())["stages_seconds"],
                }
                if not args.no_baseline:
                    base = measured([sys.executable, "-c", BASELINE, fmt, str(log), str(out)])
                    row["baseline_scan"] = base
                    row["ratio_to_scan"] = round(audit["wall_seconds"] / base["wall_seconds"], 2)
                results.append(row)
                print(
                    f"audit bench: {fmt} {records:,}: {audit['wall_seconds']:.1f} s "
                    f"({row['records_per_second']:,}/s), JVM peak {audit['peak_rss_mb']['jvm']} MB,"
                    f" machine {audit['machine_busy_cores']} cores busy",
                    file=sys.stderr,
                )
                shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    fits = {
        fmt: fit(
            [(r["records"], r["audit"]["wall_seconds"]) for r in results if r["format"] == fmt]
        )
        for fmt in formats
    }

    def wall(fmt: str, size: int) -> float | None:
        return next(
            (
                r["audit"]["wall_seconds"]
                for r in results
                if r["format"] == fmt and abs(r["records"] - size) < size * 0.05
            ),
            None,
        )

    checks = {
        "parquet_10M_le_180s": wall("parquet", 10_000_000),
        "parquet_1M_le_40s": wall("parquet", 1_000_000),
        "python_driver_rss_le_1024mb": max(
            (r["audit"]["peak_rss_mb"]["driver"] for r in results), default=None
        ),
    }
    limits = {
        "parquet_10M_le_180s": 180,
        "parquet_1M_le_40s": 40,
        "python_driver_rss_le_1024mb": 1024,
    }
    passed = all(v is None or v <= limits[k] for k, v in checks.items())
    report(
        "audit",
        {
            "sizes": sizes,
            "formats": formats,
            "master": "local[2]",
            "cpus": os.cpu_count(),
            "spark_driver_memory": "1g (Spark's default heap)",
        },
        {"runs": results, "linear_fit": fits, "checks": checks},
        {"parquet 10M": "<= 180 s", "parquet 1M": "<= 40 s", "driver memory": "< 1 GB"},
        passed,
        "; ".join(
            f"{r['format']} {r['records'] / 1e6:.0f}M {r['audit']['wall_seconds']:.0f}s"
            for r in results
        ),
        args.out,
    )
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
