"""A seeded generator of a day of execution log with planted faults, and the truth beside it.

For N cron jobs and M delayed tasks it plants missed, doubled, early and late runs at given
rates, a paused job that fires anyway (unexpected), records outside the window and invalid
records, and (for the JDBC input) delayed tasks left pending, claimed, dead or expired. Expected
occurrences come from `scheduler.audit.expected`, so DST days come out right; the truth is the
generator's own bookkeeping of what it planted: counts, and percentiles computed with numpy.

    python -m tests.support.synth --date 2026-03-29 --jobs 50 --tasks 100000 --out DIR
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import numpy as np

from scheduler.audit.expected import JobVersion, expand, to_us
from scheduler.audit.window import AuditWindow
from scheduler.store.postgres import task_states as states

# (cron, time zone): DST-sensitive zones and both kinds of job (fixed-time and real-time)
TEMPLATES = (
    ("*/5 * * * *", "UTC"),
    ("0 * * * *", "Europe/Berlin"),
    ("30 2 * * *", "America/New_York"),
    ("*/30 1 * * *", "America/New_York"),
    ("30 0 * * *", "Europe/Lisbon"),
    ("* * * * *", "UTC"),
    ("15 */2 * * *", "Asia/Kolkata"),
    ("0 9 * * 1-5", "Australia/Sydney"),
    ("*/15 * * * *", "Europe/Berlin"),
    ("0 0 * * *", "UTC"),
)
TASK_SUBJECTS = ("mq.tasks.email", "mq.tasks.billing", "mq.tasks.inference", "mq.tasks.sync")
OK, MISSED, DOUBLED, EARLY, LATE = range(5)
STATE_NAMES = ("ok", "missed", "doubled", "early", "late")
_MS = 1000


@dataclass(frozen=True, slots=True)
class Rates:
    """Probability of each planted fault per occurrence (missed applies to cron only)."""

    missed: float = 0.01
    doubled: float = 0.005
    early: float = 0.003
    late: float = 0.01


@dataclass(frozen=True, slots=True)
class JobPlan:
    """A generated job; `windows` (from, until, paused) give its history (empty: whole day)."""

    name: str
    subject: str
    cron: str
    timezone: str = "UTC"
    jitter_seconds: int = 0
    paused: bool = False
    windows: tuple[tuple[datetime | None, datetime | None, bool], ...] = ()

    def definition(self, paused: bool | None = None) -> dict[str, Any]:
        return {
            "name": self.name,
            "subject": self.subject,
            "cron": self.cron,
            "timezone": self.timezone,
            "jitter_seconds": float(self.jitter_seconds),
            "paused": self.paused if paused is None else paused,
        }

    def versions(self) -> list[JobVersion]:
        if not self.windows:
            return [JobVersion.of_definition(self.definition(), _FAR_PAST, None)]
        return [
            JobVersion.of_definition(self.definition(paused), since or _FAR_PAST, until)
            for since, until, paused in self.windows
        ]


_FAR_PAST = datetime(2000, 1, 1, tzinfo=UTC)


@dataclass
class Columns:
    """Record columns being built (numpy-friendly lists of arrays)."""

    kind: list[np.ndarray] = field(default_factory=list)
    key: list[np.ndarray] = field(default_factory=list)
    subject: list[np.ndarray] = field(default_factory=list)
    scheduled: list[np.ndarray] = field(default_factory=list)
    fired: list[np.ndarray] = field(default_factory=list)
    manual: list[np.ndarray] = field(default_factory=list)

    def add(
        self, kind: str, key: Any, subject: Any, scheduled: Any, fired: Any, manual: bool = False
    ) -> None:
        n = len(fired)
        self.manual.append(np.full(n, manual, dtype=bool))
        self.kind.append(np.full(n, kind, dtype=object))
        self.key.append(key if isinstance(key, np.ndarray) else np.full(n, key, dtype=object))
        self.subject.append(
            subject if isinstance(subject, np.ndarray) else np.full(n, subject, dtype=object)
        )
        self.scheduled.append(np.asarray(scheduled, dtype=np.int64))
        self.fired.append(np.asarray(fired, dtype=np.int64))


@dataclass
class Synth:
    """A generated day: jobs, records (as numpy columns), undelivered tasks and the truth."""

    day: date
    jobs: list[JobPlan]
    records: dict[str, np.ndarray]
    unfired: list[tuple[str, str, datetime, str]]
    truth: dict[str, Any]

    def __len__(self) -> int:
        return len(self.records["fired_at"])

    def yaml(self) -> str:
        lines = ["scheduled_jobs:"]
        for job in self.jobs:
            lines += [
                f"  - name: {job.name}",
                f"    subject: {job.subject}",
                f'    cron: "{job.cron}"',
                f"    timezone: {job.timezone}",
                "    data: {}",
            ]
            if job.jitter_seconds:
                lines.append(f"    jitter: {job.jitter_seconds}s")
            if job.paused:
                lines.append("    paused: true")
        return "\n".join(lines) + "\n"

    def history(self) -> list[tuple[str, str, datetime, datetime | None]]:
        """`schedule_history` rows: (name, definition JSON, valid_from, valid_to)."""
        rows = []
        for job in self.jobs:
            windows = job.windows or ((None, None, job.paused),)
            for since, until, paused in windows:
                start = since or datetime.combine(self.day, datetime.min.time(), UTC) - _DAY
                rows.append((job.name, json.dumps(job.definition(paused)), start, until))
        return rows

    def table(self) -> Any:
        import pyarrow as pa

        ts = pa.timestamp("us", tz="UTC")
        r = self.records
        n = len(self)
        return pa.table(
            {
                "kind": pa.array(r["kind"], pa.string()),
                "key": pa.array(r["key"], pa.string()),
                "subject": pa.array(r["subject"], pa.string()),
                "scheduled_for": pa.array(r["scheduled_for"], ts),
                "fired_at": pa.array(r["fired_at"], ts),
                "attempt": pa.array(np.ones(n, dtype=np.int32)),
                "epoch": pa.array(np.full(n, 7, dtype=np.int64)),
                "instance": pa.array(np.full(n, "synth-1", dtype=object), pa.string()),
                "stream_seq": pa.array(np.arange(1, n + 1, dtype=np.int64)),
                "manual": pa.array(r["manual"], pa.bool_()),
            }
        )

    def write_parquet(self, path: Path, files: int = 1) -> None:
        import pyarrow.parquet as pq

        path.mkdir(parents=True, exist_ok=True)
        table = self.table()
        step = -(-len(self) // files) if len(self) else 1
        for index in range(files):
            part = table.slice(index * step, step)
            pq.write_table(part, path / f"part-{index:03d}.parquet", row_group_size=500_000)

    def write_jsonl(self, path: Path, junk_lines: int = 0, files: int = 1) -> None:
        """JSON lines (`junk_lines` extra lines that are not JSON at the end of the first file)."""
        path.mkdir(parents=True, exist_ok=True)
        r = self.records
        scheduled = _rfc3339(r["scheduled_for"])
        fired = _rfc3339(r["fired_at"])
        n = len(self)
        step = -(-n // files) if n else 1
        for index in range(files):
            lo, hi = index * step, min(n, (index + 1) * step)
            with open(path / f"part-{index:03d}.jsonl", "w", encoding="utf-8") as handle:
                handle.writelines(
                    f'{{"kind":{_js(r["kind"][i])},"key":{_js(r["key"][i])},'
                    f'"subject":{_js(r["subject"][i])},"scheduled_for":"{scheduled[i]}",'
                    f'"fired_at":"{fired[i]}","attempt":1,"epoch":7,"instance":"synth-1",'
                    f'"stream_seq":{i + 1},"manual":{"true" if r["manual"][i] else "false"}}}\n'
                    for i in range(lo, hi)
                )
                if index == 0:
                    handle.writelines("this line is not JSON\n" for _ in range(junk_lines))

    def write_schedules(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "jobs.yaml").write_text(self.yaml(), encoding="utf-8")


def _js(value: Any) -> str:
    return "null" if value is None else json.dumps(value)


def _rfc3339(us: np.ndarray) -> list[str]:
    unit: Literal["ms", "us"] = "ms" if len(us) == 0 or not (us % _MS).any() else "us"
    text = np.datetime_as_string(us.astype("datetime64[us]"), unit=unit)
    return [t + "Z" for t in text.tolist()]


_DAY = timedelta(days=1)


def default_jobs(count: int, templates: tuple[tuple[str, str], ...] = TEMPLATES) -> list[JobPlan]:
    """`count` jobs cycling through `templates`; every 7th with 30 s jitter, the 4th paused."""
    jobs = []
    for i in range(count):
        cron, zone = templates[i % len(templates)]
        jobs.append(
            JobPlan(
                name=f"job-{i:04d}",
                subject=f"mq.scheduled.s{i % 5}",
                cron=cron,
                timezone=zone,
                jitter_seconds=30 if i % 7 == 6 else 0,
                paused=i == 3,
            )
        )
    return jobs


class _Truth:
    """Per schedule / subject / kind / hour bookkeeping of what was planted."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.lateness: dict[tuple[str, str], list[np.ndarray]] = defaultdict(list)

    def add(self, groups: list[tuple[str, str]], counts: dict[str, int], late: np.ndarray) -> None:
        for group in groups:
            for name, value in counts.items():
                self.counts[group][name] += int(value)
            self.lateness[group].append(late)

    def entry(self, group: tuple[str, str]) -> dict[str, Any]:
        counts = dict(self.counts[group])
        values = np.concatenate(self.lateness[group]) if self.lateness[group] else np.array([])
        if len(values):
            p50, p95, p99 = np.percentile(values, [50, 95, 99])
            stats = {"p50": p50, "p95": p95, "p99": p99, "max": values.max(), "mean": values.mean()}
        else:
            stats = dict.fromkeys(("p50", "p95", "p99", "max", "mean"))
        return {**counts, "lateness_ms": {k: _plain(v) for k, v in stats.items()}}

    def section(self, kind: str) -> dict[str, Any]:
        return {name: self.entry((k, name)) for k, name in sorted(self.counts) if k == kind}


def _plain(value: Any) -> float | None:
    return None if value is None else float(value)


def generate(
    day: date,
    jobs: list[JobPlan] | int = 20,
    tasks: int = 1000,
    seed: int = 1,
    rates: Rates = Rates(),
    late_ms: int = 1000,
    unfired: int = 0,
    edge_records: bool = True,
) -> Synth:
    """A day of log with planted faults and its truth (see the module docstring)."""
    plans = default_jobs(jobs) if isinstance(jobs, int) else list(jobs)
    rng = np.random.default_rng(seed)
    window = AuditWindow.of_day(day)
    start_us, end_us = to_us(window.start), to_us(window.end)
    cols, truth = Columns(), _Truth()
    for plan in plans:
        _plant_job(plan, rng, rates, late_ms, start_us, end_us, cols, truth)
    _plant_tasks(tasks, rng, rates, late_ms, start_us, cols, truth)
    undelivered = _plant_unfired(unfired, rng, start_us, truth)
    invalid = _plant_edges(plans, start_us, end_us, cols) if edge_records else {}
    if edge_records and plans:
        groups = [("schedule", plans[0].name), ("subject", plans[0].subject), ("kind", "manual")]
        truth.add(groups, {"manual": 1}, np.array([], np.int64))
    records = {
        "kind": np.concatenate(cols.kind) if cols.kind else np.array([], dtype=object),
        "key": np.concatenate(cols.key) if cols.key else np.array([], dtype=object),
        "subject": np.concatenate(cols.subject) if cols.subject else np.array([], dtype=object),
        "scheduled_for": np.concatenate(cols.scheduled) if cols.scheduled else np.array([], "i8"),
        "fired_at": np.concatenate(cols.fired) if cols.fired else np.array([], "i8"),
        "manual": np.concatenate(cols.manual) if cols.manual else np.array([], bool),
    }
    doc = {
        "date": day.isoformat(),
        "schedules": truth.section("schedule"),
        "subjects": truth.section("subject"),
        "kinds": truth.section("kind"),
        "hours": {k: v for k, v in truth.section("hour").items()},
        "invalid": invalid,
        "records": len(records["fired_at"]),
    }
    return Synth(day, plans, records, undelivered, doc)


def _states(rng: np.random.Generator, n: int, rates: Rates, missed: bool) -> np.ndarray:
    """OK, MISSED, DOUBLED, EARLY or LATE per occurrence."""
    p = [rates.missed if missed else 0.0, rates.doubled, rates.early, rates.late]
    roll = rng.random(n)
    states = np.zeros(n, dtype=np.int8)
    low = 0.0
    for code, prob in zip((MISSED, DOUBLED, EARLY, LATE), p, strict=True):
        states[(roll >= low) & (roll < low + prob)] = code
        low += prob
    return states


def _lateness(rng: np.random.Generator, states: np.ndarray, late_ms: int) -> np.ndarray:
    late = rng.integers(0, 50, len(states))
    early = states == EARLY
    late[early] = rng.integers(-900, 0, int(early.sum()))
    slow = states == LATE
    late[slow] = rng.integers(late_ms + 1, 4 * late_ms, int(slow.sum()))
    return late


def _deliveries(
    rng: np.random.Generator, due: np.ndarray, states: np.ndarray, late: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(index of the occurrence, fired_at µs) of every delivery: one each, two for doubled."""
    sent = states != MISSED
    index = np.nonzero(sent)[0]
    fired = due[index] + late[index] * _MS
    twice = np.nonzero(states == DOUBLED)[0]
    again = due[twice] + (late[twice] + rng.integers(1, 3000, len(twice))) * _MS
    return np.concatenate([index, twice]), np.concatenate([fired, again])


def _summary_counts(
    states: np.ndarray, late: np.ndarray, late_ms: int, rows: int
) -> dict[str, Any]:
    sent = states != MISSED
    return {
        "fired": rows,
        "missed": int((states == MISSED).sum()),
        "doubled": int((states == DOUBLED).sum()),
        "early": int((sent & (late < 0)).sum()),
        "late": int((sent & (late > late_ms)).sum()),
    }


def _plant_job(
    plan: JobPlan,
    rng: np.random.Generator,
    rates: Rates,
    late_ms: int,
    start_us: int,
    end_us: int,
    cols: Columns,
    truth: _Truth,
) -> None:
    scheduled_l: list[int] = []
    due_l: list[int] = []
    for version in plan.versions():
        s, d = expand(version, start_us, end_us)
        scheduled_l += s
        due_l += d
    scheduled, due = np.asarray(scheduled_l, np.int64), np.asarray(due_l, np.int64)
    n = len(scheduled)
    states = _states(rng, n, rates, missed=True)
    late = _lateness(rng, states, late_ms)
    index, fired = _deliveries(rng, due, states, late)
    cols.add("cron", plan.name, plan.subject, scheduled[index], fired)
    counts = {"expected": n, **_summary_counts(states, late, late_ms, len(fired))}
    counts["unexpected"] = 0
    first = late[states != MISSED]
    groups = [("schedule", plan.name), ("subject", plan.subject), ("kind", "cron")]
    truth.add(groups, counts, first)
    if plan.paused:
        _plant_unexpected(plan, rng, start_us, end_us, cols, truth)
    hours = ((scheduled - start_us) // 3_600_000_000).astype(int)
    for hour in np.unique(hours):
        at = hours == hour
        hour_counts = {
            "expected": int(at.sum()),
            "missed": int((states[at] == MISSED).sum()),
            "fired": int(np.isin(index, np.nonzero(at)[0]).sum()),
        }
        truth.add([("hour", f"{hour:02d} cron")], hour_counts, late[at & (states != MISSED)])


def _plant_unexpected(
    plan: JobPlan,
    rng: np.random.Generator,
    start_us: int,
    end_us: int,
    cols: Columns,
    truth: _Truth,
) -> None:
    """A paused job that fires anyway, twice: deliveries nobody expected."""
    active = JobVersion(plan.name, plan.subject, plan.cron, plan.timezone)
    scheduled = np.asarray(expand(active, start_us, end_us)[0][:2], np.int64)
    late = rng.integers(0, 50, len(scheduled))
    cols.add("cron", plan.name, plan.subject, scheduled, scheduled + late * _MS)
    counts = {"fired": len(scheduled), "unexpected": len(scheduled)}
    truth.add([("schedule", plan.name), ("subject", plan.subject)], counts, late)
    truth.add([("kind", "cron")], counts, late)


def _plant_tasks(
    tasks: int,
    rng: np.random.Generator,
    rates: Rates,
    late_ms: int,
    start_us: int,
    cols: Columns,
    truth: _Truth,
) -> None:
    if tasks <= 0:
        return
    due = start_us + rng.integers(0, 86_400_000 - 5000, tasks) * _MS
    subjects = np.asarray(TASK_SUBJECTS, dtype=object)[rng.integers(0, len(TASK_SUBJECTS), tasks)]
    keys = np.asarray([f"task-{i:09d}" for i in range(tasks)], dtype=object)
    states = _states(rng, tasks, rates, missed=False)
    late = _lateness(rng, states, late_ms)
    index, fired = _deliveries(rng, due, states, late)
    cols.add("delayed", keys[index], subjects[index], due[index], fired)
    for subject in TASK_SUBJECTS:
        at = subjects == subject
        rows = int(np.isin(index, np.nonzero(at)[0]).sum())
        counts = {"expected": int(at.sum()), **_summary_counts(states[at], late[at], late_ms, rows)}
        truth.add([("subject", subject), ("kind", "delayed")], counts, late[at])


def _plant_unfired(
    count: int, rng: np.random.Generator, start_us: int, truth: _Truth
) -> list[tuple[str, str, datetime, str]]:
    """Delayed tasks due in the day but never delivered (seen only through PostgreSQL)."""
    out = []
    states = ("pending", "claimed", "dead", "expired")
    for i in range(count):
        state = states[i % len(states)]
        subject = TASK_SUBJECTS[i % len(TASK_SUBJECTS)]
        due = start_us + int(rng.integers(0, 86_000_000)) * _MS
        out.append((f"unfired-{i:06d}", subject, _at(due), state))
        bucket = "overdue" if state in ("pending", "claimed") else state
        counts = {"expected": 1, bucket: 1}
        truth.add([("subject", subject), ("kind", "delayed")], counts, np.array([], np.int64))
    return out


def _at(us: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)


def _plant_edges(plans: list[JobPlan], start_us: int, end_us: int, cols: Columns) -> dict[str, Any]:
    """Records the audit must leave out: outside the window, or invalid."""
    name = plans[0].name if plans else "job-edge"
    subject = plans[0].subject if plans else "mq.scheduled.s0"
    minute = 60_000_000
    # due the day before, fired just after midnight: outside the window
    cols.add("cron", name, subject, [start_us - minute], [start_us + 100 * _MS])
    # a delayed task fired long after the grace: outside the window
    cols.add(
        "delayed", "task-too-late", TASK_SUBJECTS[0], [end_us - minute], [end_us + 7_200_000_000]
    )
    # an operator's "trigger now": logged, but no occurrence of the job's schedule
    at = start_us + 2 * 3600 * 1_000_000 + 7_777
    cols.add("cron", name, subject, [at], [at + 3 * _MS], manual=True)
    cols.add("bogus", "x-1", subject, [start_us + minute], [start_us + minute])
    cols.add("delayed", np.array([None], dtype=object), subject, [start_us], [start_us])
    return {"kind is neither cron nor delayed": 1, "no key": 1, "outside_window": 2}


async def load_postgres(dsn: str, synth: Synth, invalid: bool = False) -> None:
    """Load the records into `fire_log`, undelivered tasks into `delayed_messages` and the jobs'
    history into `schedule_history` (invalid records are left out: the table refuses them)."""
    import asyncpg

    r = synth.records
    valid = np.isin(r["kind"], ["cron", "delayed"]) & np.asarray(
        [k is not None for k in r["key"]], dtype=bool
    )
    rows = [
        (
            r["kind"][i],
            r["key"][i],
            r["subject"][i],
            _at(int(r["scheduled_for"][i])),
            _at(int(r["fired_at"][i])),
            1,
            7,
            "synth-1",
            "JOBS",
            i + 1,
            bool(r["manual"][i]),
        )
        for i in np.nonzero(valid)[0]
    ]
    conn = await asyncpg.connect(dsn)
    try:
        columns = ["kind", "key", "subject", "scheduled_for", "fired_at", "attempt", "epoch"]
        columns += ["instance", "stream", "stream_seq", "manual"]
        await conn.copy_records_to_table("fire_log", records=rows, columns=columns)
        # a row that reads as the planted state: a claimed one keeps its ready status and
        # has a `claimed_epoch` (scheduler.store.postgres.task_states)
        await conn.executemany(
            "INSERT INTO delayed_messages (id, target, payload, due_at, scheduled_for, status, "
            "claimed_epoch) VALUES ($1, $2, '\\x7b7d'::bytea, $3, $3, "
            f"{states.stored('$4', '7')})",
            synth.unfired,
        )
        await conn.executemany(
            "INSERT INTO schedule_history (name, definition, valid_from, valid_to) "
            "VALUES ($1, $2::jsonb, $3, $4)",
            synth.history(),
        )
    finally:
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--date", required=True, type=date.fromisoformat)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--files", type=int, default=1, help="split the log over this many files")
    parser.add_argument("--format", choices=("jsonl", "parquet", "both"), default="both")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    synth = generate(args.date, args.jobs, args.tasks, args.seed)
    if args.format in ("parquet", "both"):
        synth.write_parquet(args.out / "parquet", args.files)
    if args.format in ("jsonl", "both"):
        synth.write_jsonl(args.out / "jsonl", files=args.files)
    synth.write_schedules(args.out / "schedules")
    (args.out / "truth.json").write_text(json.dumps(synth.truth, indent=1), encoding="utf-8")
    print(json.dumps({"records": len(synth), "out": str(args.out)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
