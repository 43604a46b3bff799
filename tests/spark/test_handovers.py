"""Handovers in the drift audit: the partition Spark computes is `partition_of`'s, the terms and
handovers of each partition, the neighbourhoods around them and the faults due there, and the
whole audit's `handovers` block, tables and report section."""

from __future__ import annotations

import json
import random
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from scheduler.audit.handovers import (
    counts,
    covered,
    fault_counts,
    faults,
    handovers,
    neighbourhoods,
    partition_column,
    per_handover,
    terms,
)
from scheduler.audit.window import AuditWindow
from scheduler.partitions import MAX_PARTITIONS, partition_of
from tests.spark.conftest import run_audit

pytestmark = pytest.mark.spark

DAY = date(2026, 11, 21)
WINDOW = AuditWindow.of_day(DAY)
COUNTS = (1, 2, 3, 7, 64, 1000, MAX_PARTITIONS)
LOG_SCHEMA = "key string, fired_at timestamp, epoch bigint, instance string, manual boolean"
TERM_SCHEMA = (
    "partition int, epoch bigint, instance string, first_fired_at timestamp, "
    "last_fired_at timestamp, fires bigint"
)
OCC_SCHEMA = (
    "kind string, key string, due_at timestamp, late boolean, missed boolean, doubled boolean"
)
MARGIN = timedelta(seconds=10)


def t(hour: int, minute: int = 0, second: int = 0, ms: int = 0, day: int = 21) -> datetime:
    return datetime(2026, 11, day, hour, minute, second, ms * 1000, tzinfo=UTC)


def us(instant: datetime) -> int:
    return (instant - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def key_in(partition: int, count: int, prefix: str = "task") -> str:
    """The first `<prefix>-<n>` whose partition among `count` is `partition`."""
    return next(
        k for k in (f"{prefix}-{n}" for n in range(10_000)) if partition_of(k, count) == partition
    )


def sample_keys() -> list[str]:
    """ULID-like ids, names, text with 2-, 3- and 4-byte UTF-8 characters (combining marks,
    CJK, emoji, astral letters), random code points, the empty key and a long one."""
    rng = random.Random(37)
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    ulids = ["".join(rng.choices(alphabet, k=26)) for _ in range(800)]
    names = [f"task-{i}" for i in range(300)] + [f"credit-reconciliation-{i}" for i in range(100)]
    pieces = [
        "é",
        "€",
        "😀",
        "ключ",
        "キー",
        "\U0001d518\U0001d52b",
        "e\u0301",
        "中文",
        "\u00a0",
        "ß",
        "🇵🇹",
    ]
    mixed = [f"{rng.choice(pieces)}-{i}-{rng.choice(pieces)}" for i in range(400)]
    code_points = [c for c in range(0x80, 0x30000) if not 0xD800 <= c <= 0xDFFF]
    randoms = [
        "".join(chr(rng.choice(code_points)) for _ in range(rng.randint(1, 12))) for _ in range(400)
    ]
    edge = ["", "a" * 1000, "é€😀", " ", "01JF3Z8Q6W5N4XKJ7Y2V9B0C1D", "credit-reconciliation"]
    return sorted(set(ulids + names + mixed + randoms + edge))


def test_spark_computes_partition_of_with_its_own_functions(spark: Any, capsys: Any) -> None:
    """For 2,000 keys (ASCII, unicode of every UTF-8 width, empty, long) and counts from 1 to
    4096 the partition Spark computes equals `scheduler.partitions.partition_of`, without a
    Python UDF in the plan."""
    keys = sample_keys()
    assert len(keys) > 1900
    frame = spark.createDataFrame([(k,) for k in keys], "key string")
    columns = [partition_column(F.col("key"), n).alias(f"p{n}") for n in COUNTS]
    got = {
        r["key"]: tuple(r[f"p{n}"] for n in COUNTS) for r in frame.select("key", *columns).collect()
    }
    want = {k: tuple(partition_of(k, n) for n in COUNTS) for k in keys}
    assert got == want
    assert len({p[-1] for p in want.values()}) > 1500  # the keys spread: a constant would fail
    frame.select(*columns).explain(True)
    plan = capsys.readouterr().out
    assert "sha2" in plan and "EvalPython" not in plan and "pythonUDF" not in plan


def log(spark: Any, rows: list[tuple[Any, ...]]) -> Any:
    return spark.createDataFrame(rows, LOG_SCHEMA)


def test_one_partition_gives_a_handover_at_each_change_of_term(spark: Any) -> None:
    """Under P = 1 the terms are ordered by their first fire and each change is a handover
    (a leader change): to another instance (moved) or to a new term of the same one; manual
    fires belong to no term and fires without an epoch are counted apart."""
    fired = log(
        spark,
        [
            ("job-a", t(1), 1, "a", False),
            ("task-1", t(1, 30), 1, "a", False),
            ("job-a", t(2), 1, "a", False),
            ("job-a", t(2, 0, 1), 1, "edge", True),  # an operator's trigger
            ("task-2", t(2, 0, 3, 500), 2, "b", False),
            ("job-a", t(3), 2, "b", False),
            ("task-3", t(4), 3, "b", False),
            ("task-4", t(4, 30), None, "b", False),
            ("job-a", t(5), 3, "b", False),
        ],
    )
    term_rows = terms(fired, 1)
    want_terms = spark.createDataFrame(
        [
            (0, None, "b", t(4, 30), t(4, 30), 1),
            (0, 1, "a", t(1), t(2), 3),
            (0, 2, "b", t(2, 0, 3, 500), t(3), 2),
            (0, 3, "b", t(4), t(5), 2),
        ],
        TERM_SCHEMA,
    )
    assert_df_equality(
        term_rows.orderBy("epoch"), want_terms, ignore_nullable=True, ignore_column_order=True
    )
    steps = handovers(term_rows)
    want = spark.createDataFrame(
        [
            (0, "a", 1, t(2), "b", 2, t(2, 0, 3, 500), 3500, True, False),
            (0, "b", 2, t(3), "b", 3, t(4), 3_600_000, False, False),
        ],
        "partition int, from_instance string, from_epoch bigint, last_fired_at timestamp, "
        "to_instance string, to_epoch bigint, first_fired_at timestamp, gap_ms bigint, "
        "moved boolean, suspect boolean",
    )
    assert_df_equality(steps.orderBy("to_epoch"), want, ignore_nullable=True)
    row = counts(term_rows, steps).collect()[0].asDict()
    assert row == {
        "terms": 3,
        "unattributed": 1,
        "handovers": 2,
        "moves": 1,
        "suspect": 0,
        "gap_p50_ms": 1_801_750.0,
        "gap_max_ms": 3_600_000,
    }


def moving_log(spark: Any) -> Any:
    """Engine `a` holds partitions 0 and 1 of four (epoch 5); at 02:00 `b` takes partition 1
    (epoch 6) and `a` goes on with partition 0 in a new term (epoch 7)."""
    k0, k1 = key_in(0, 4), key_in(1, 4)
    return log(
        spark,
        [
            (k0, t(1), 5, "a", False),
            (k1, t(1, 0, 1), 5, "a", False),
            (k0, t(2), 5, "a", False),
            (k1, t(2, 0, 0, 20), 5, "a", False),
            (k0, t(2, 0, 0, 50), 7, "a", False),
            (k1, t(2, 0, 1), 6, "b", False),
            (k1, t(3), 6, "b", False),
            (k0, t(3), 7, "a", False),
        ],
    )


HANDOVER_SHAPE = "partition int, from_epoch bigint, to_epoch bigint, gap_ms bigint, moved boolean"
HANDOVER_SHAPE += ", suspect boolean"


def shape(steps: Any) -> Any:
    columns = ["partition", "from_epoch", "to_epoch", "gap_ms", "moved", "suspect"]
    return steps.select(*columns).orderBy("partition", "to_epoch")


def test_each_partition_has_its_own_handovers(spark: Any) -> None:
    """Under P = 4 the move of partition 1 to `b` and the new term of `a` over partition 0 are
    one handover each, in their own partition; nothing else changes hands."""
    steps = handovers(terms(moving_log(spark), 4))
    want = spark.createDataFrame(
        [(0, 5, 7, 50, False, False), (1, 5, 6, 980, True, False)], HANDOVER_SHAPE
    )
    assert_df_equality(shape(steps), want, ignore_nullable=True)


def test_an_audit_told_the_wrong_partition_count_sees_suspect_handovers(spark: Any) -> None:
    """The same log read as P = 1 interleaves two engines' terms: `a`'s epoch 5 hands over to
    its epoch 7 (30 ms after its last fire in either partition), and the handover from there to
    `b`'s epoch 6 goes back in epoch and overlaps in time, so it is suspect."""
    steps = handovers(terms(moving_log(spark), 1))
    want = spark.createDataFrame(
        [(0, 5, 7, 30, False, False), (0, 7, 6, -3_599_000, True, True)], HANDOVER_SHAPE
    )
    assert_df_equality(shape(steps).orderBy("from_epoch"), want, ignore_nullable=True)


def test_a_move_into_a_grown_term_may_go_down_in_epoch_but_not_share_one(spark: Any) -> None:
    """Partition 0 moves from `b`'s epoch 9 to `a`'s epoch 4, a running term that gained it
    in place: not suspect; partition 1 moves from `b`'s epoch 9 to `c` with the same number,
    which no fence issues twice: suspect; partition 2's `a` begins a term below its last."""
    rows = [
        (0, 9, "b", t(1), t(2), 5),
        (0, 4, "a", t(2, 0, 3), t(3), 5),
        (1, 9, "b", t(1), t(2), 5),
        (1, 9, "c", t(2, 0, 3), t(3), 5),
        (2, 8, "a", t(1), t(2), 5),
        (2, 7, "a", t(2, 0, 3), t(3), 5),
    ]
    steps = handovers(spark.createDataFrame(rows, TERM_SCHEMA))
    want = spark.createDataFrame(
        [
            (0, 9, 4, 3_000, True, False),
            (1, 9, 9, 3_000, True, True),
            (2, 8, 7, 3_000, False, True),
        ],
        HANDOVER_SHAPE,
    )
    assert_df_equality(shape(steps), want, ignore_nullable=True)


def neighbourhood_terms(spark: Any) -> Any:
    """Partition 0 changes hands twice around 01:00, partition 1 just after the window opens,
    partition 2 just before it closes."""
    return spark.createDataFrame(
        [
            (0, 1, "a", t(0, 30), t(1), 10),
            (0, 2, "b", t(1, 0, 2), t(1, 0, 5), 2),
            (0, 3, "c", t(1, 0, 6), t(2), 10),
            (1, 1, "a", t(23, 59, day=20), t(23, 59, 58, day=20), 2),
            (1, 2, "b", t(0, 0, 1), t(3), 10),
            (2, 1, "a", t(20), t(23, 59, 55), 10),
            (2, 2, "b", t(0, 0, 5, day=22), t(0, 0, 30, day=22), 2),
        ],
        TERM_SCHEMA,
    )


def test_neighbourhoods_are_cut_to_the_window_and_counted_once(spark: Any) -> None:
    """Each neighbourhood spans the gap and `margin` either side, cut to the window; their
    coverage counts overlapping ones once (26 s + 11 s + 15 s)."""
    hoods = neighbourhoods(handovers(neighbourhood_terms(spark)), MARGIN, WINDOW)
    want = spark.createDataFrame(
        [
            (0, 2, "b", us(t(0, 59, 50)), us(t(1, 0, 12))),
            (0, 3, "c", us(t(0, 59, 55)), us(t(1, 0, 16))),
            (1, 2, "b", us(t(0)), us(t(0, 0, 11))),
            (2, 2, "b", us(t(23, 59, 45)), us(t(0, day=22))),
        ],
        "partition int, to_epoch bigint, to_instance string, lo_us bigint, hi_us bigint",
    )
    assert_df_equality(hoods.orderBy("partition", "to_epoch"), want, ignore_nullable=True)
    assert covered(hoods).collect()[0]["covered_us"] == 52_000_000


def test_faults_near_a_handover_of_their_own_partition_are_counted(spark: Any) -> None:
    """Late, missed and doubled runs due in a neighbourhood of their own partition are near;
    one in two overlapping neighbourhoods counts once in the totals and once for each
    handover; runs of other partitions, outside, on time or manual are not counted."""
    k0, k0b, k1, k3 = key_in(0, 4), key_in(0, 4, "job"), key_in(1, 4), key_in(3, 4)
    occ = spark.createDataFrame(
        [
            ("cron", k0, t(1, 0, 5), True, False, False),  # in both of partition 0's
            ("delayed", k0b, t(2), True, False, False),
            ("cron", k0, t(0, 59, 52), False, True, False),  # in the first only
            ("cron", k0, t(1, 30), False, True, False),
            ("cron", k1, t(1, 0, 5), False, False, True),  # partition 1's is at 00:00
            ("cron", k1, t(0, 0, 3), False, False, True),
            ("cron", k3, t(1, 0, 5), True, False, False),  # no handover in partition 3
            ("cron", k0, t(1, 0, 1), False, False, False),
            ("manual", k0, t(1, 0, 1), True, False, False),
        ],
        OCC_SCHEMA,
    )
    steps = handovers(neighbourhood_terms(spark))
    hoods = neighbourhoods(steps, MARGIN, WINDOW)
    found = faults(occ, 4)
    assert fault_counts(found, hoods).collect()[0].asDict() == {
        "late": 3,
        "missed": 2,
        "doubled": 2,
        "late_near": 1,
        "missed_near": 1,
        "doubled_near": 1,
    }
    each = per_handover(steps, found, hoods).select(
        "partition", "to_epoch", "late_near", "missed_near", "doubled_near"
    )
    want = spark.createDataFrame(
        [(0, 2, 1, 1, 0), (0, 3, 1, 0, 0), (1, 2, 0, 0, 1), (2, 2, 0, 0, 0)],
        "partition int, to_epoch bigint, late_near bigint, missed_near bigint, doubled_near bigint",
    )
    assert_df_equality(each.orderBy("partition", "to_epoch"), want, ignore_nullable=True)


# -- the whole audit -----------------------------------------------------------------------------


def iso(instant: datetime) -> str:
    return instant.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def record(kind: str, key: str, due: datetime, fired: datetime, epoch: int, instance: str) -> str:
    doc: dict[str, object] = {"kind": kind, "key": key, "subject": f"mq.scheduled.{kind}"}
    doc |= {"scheduled_for": iso(due), "fired_at": iso(fired), "attempt": 1}
    return json.dumps(doc | {"epoch": epoch, "instance": instance})


def moved_day(folder: Path) -> tuple[int, int]:
    """A day under P = 2: the hourly job `tick` (its partition) moves from `a` (epoch 1) to `b`
    (epoch 2) at 01:00, its 01:00 run 4 s late and its 02:00 run missed; `a` goes on with the
    tasks' partition in a new term (epoch 3), one task at 05:00 3 s late. Returns the
    partitions of the job and of the tasks."""
    job, lines = "tick", []
    tick, tasks = partition_of(job, 2), 1 - partition_of(job, 2)
    ms5 = timedelta(milliseconds=5)
    for hour in range(24):
        due = t(hour)
        if hour == 0:
            lines.append(record("cron", job, due, due + ms5, 1, "a"))
        elif hour == 1:
            lines.append(record("cron", job, due, due + timedelta(seconds=4), 2, "b"))
        elif hour != 2:
            lines.append(record("cron", job, due, due + ms5, 2, "b"))
    keys = (k for k in (f"task-{n}" for n in range(10_000)) if partition_of(k, 2) == tasks)
    for index, key in zip(range(144), keys, strict=False):
        due = t(0) + timedelta(minutes=10 * index)
        late = timedelta(seconds=3) if due == t(5) else ms5
        term = (1, "a") if due < t(1) else (3, "a")
        lines.append(record("delayed", key, due, due + late, *term))
    (folder / "log.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "schedules").mkdir()
    (folder / "schedules" / "tick.yaml").write_text(
        f'scheduled_jobs:\n  - {{name: {job}, subject: mq.scheduled.cron, cron: "0 * * * *"}}\n'
    )
    return tick, tasks


def audit_day(folder: Path, out: str, *args: str) -> Any:
    return run_audit(
        folder / out,
        "--date",
        DAY.isoformat(),
        "--input",
        str(folder / "log.jsonl"),
        "--schedules",
        str(folder / "schedules"),
        *args,
    )


def test_the_audit_reports_each_handover_and_the_faults_near_it(spark: Any, tmp_path: Path) -> None:
    """Audited with --partitions 2: two handovers at 01:00 (the job's partition moved, the
    tasks' partition in a new term), the late 01:00 run near the move, the missed 02:00 run
    and the late 05:00 task not near one; the tables, the progress line and the report say
    so."""
    tick, tasks = moved_day(tmp_path)
    run = audit_day(tmp_path, "out", "--partitions", "2")
    assert run.code == 0, run.stderr
    block = run.summary["handovers"]
    assert (block["partitions"], block["partitions_from"]) == (2, "--partitions")
    assert (block["count"], block["leader_changes"], block["moves"]) == (2, None, 1)
    assert (block["term_restarts"], block["suspect"], block["terms"]) == (1, 0, 3)
    assert block["per_hour"] == {"2026-11-21T01:00Z": 2}
    assert block["near"] == {
        "margin_seconds": 10.0,
        "share_of_time": round(4234 / 172_800, 6),  # (3614 s + 620 s) of 2 x 24 h
        "late": {"near": 1, "all": 2},
        "missed": {"near": 0, "all": 1},
        "doubled": {"near": 0, "all": 0},
    }
    restart, move = block["list"]
    assert restart == {
        "partition": tasks,
        "from_instance": "a",
        "from_epoch": 1,
        "last_fired_at": "2026-11-21T00:50:00.005Z",
        "to_instance": "a",
        "to_epoch": 3,
        "first_fired_at": "2026-11-21T01:00:00.005Z",
        "gap_ms": 600_000,
        "moved": False,
        "suspect": False,
        "late_near": 0,
        "missed_near": 0,
        "doubled_near": 0,
    }
    assert (move["partition"], move["from_instance"], move["to_instance"]) == (tick, "a", "b")
    assert (move["gap_ms"], move["moved"], move["late_near"]) == (3_603_995, True, 1)
    assert block["unlisted"] == 0
    assert "handovers: 2 over 2 partition(s) (1 moved, 1 term restarts, 0 suspect)" in run.stderr
    assert spark.read.parquet(str(run.out / "handovers")).count() == 2
    assert spark.read.parquet(str(run.out / "terms")).count() == 4
    html = (run.out / "report.html").read_text()
    assert "<b>2 handover(s)</b> of a partition among P = 2 (from --partitions)" in html


def test_without_the_partition_count_a_partitioned_day_shows_suspect_leader_changes(
    spark: Any, tmp_path: Path
) -> None:
    """The same day audited without --partitions is read as P = 1 (one leader): `a`'s new
    term and `b`'s overlap, so one of the two leader changes is suspect, and the report asks
    whether --partitions is right; --handover-margin sets what counts as near."""
    moved_day(tmp_path)
    run = audit_day(tmp_path, "out", "--handover-margin", "1m")
    assert run.code == 0, run.stderr
    block = run.summary["handovers"]
    assert (block["partitions"], block["partitions_from"]) == (1, "default")
    assert (block["count"], block["leader_changes"], block["suspect"]) == (2, 2, 1)
    assert block["near"]["margin_seconds"] == 60.0
    html = (run.out / "report.html").read_text()
    assert "<b>2 leader change(s)</b> (P = 1, the default" in html
    assert "1 suspect handover(s)" in html and "Is --partitions the deployment's count?" in html
