"""Handovers: each change of the term that fires a partition (docs/drift-audit.md, "Handovers").

Under P partitions every delivery belongs to the partition of its key
(`scheduler.partitions.partition_of`, computed here with Spark's own functions) and to the
term that fired it, (epoch, instance). Per partition the terms that fired in the window are
put in the order of their first fire; each change from one term to the next is a handover:
under P = 1 a leader change, under P > 1 a partition moving to another engine or its engine
starting a new term over a changed set of partitions (docs/leadership.md, "Partitions").

Plain `DataFrame -> DataFrame` functions, PySpark imported inside, as in `transforms`:
`terms()` reads the log once into a small table; everything else works from that table and
from the classified occurrences.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from scheduler.audit.expected import to_us
from scheduler.audit.summary import HANDOVER_FAULTS as FAULTS
from scheduler.audit.window import AuditWindow

HOUR_US = 3_600_000_000
HANDOVER = ("partition", "to_epoch", "to_instance")  # a term takes a partition once


def partition_column(key: Any, count: int) -> Any:
    """`partition_of(key, count)` as a Spark column: the first four bytes of the SHA-256 of the
    key's UTF-8 bytes (its first eight hex digits), big-endian, modulo `count`."""
    from pyspark.sql import functions as F

    if count == 1:
        return F.lit(0)
    first_four_bytes = F.substring(F.sha2(key.cast("binary"), 256), 1, 8)
    return F.pmod(F.conv(first_four_bytes, 16, 10).cast("bigint"), F.lit(count)).cast("int")


def terms(log: Any, count: int) -> Any:
    """One row per partition and term that fired in it: `partition`, `epoch`, `instance`,
    `first_fired_at`, `last_fired_at`, `fires`.

    An operator's manual fires belong to no term (the process that served the trigger writes
    them with partition 0's epoch) and are left out. Deliveries without an epoch or an
    instance keep a row of their own with the missing part null: counted, never a term."""
    from pyspark.sql import functions as F

    manual = F.coalesce(F.col("manual"), F.lit(False)) if "manual" in log.columns else F.lit(False)
    fired = log.filter(~manual)
    return fired.groupBy(
        partition_column(F.col("key"), count).alias("partition"), "epoch", "instance"
    ).agg(
        F.min("fired_at").alias("first_fired_at"),
        F.max("fired_at").alias("last_fired_at"),
        F.count(F.lit(1)).alias("fires"),
    )


def handovers(term_rows: Any) -> Any:
    """One row per handover: in each partition, each term after the first (in the order of
    their first fires) and the term before it. `gap_ms` runs from the old term's last fire to
    the new one's first (whole ms, floored); `moved` when the instance changed (else its
    engine began a new term); `suspect` (`_suspect`) when the epochs cannot be two terms in
    that order or the two terms' fires overlap in time (the hosts' clocks disagree, or the
    audit's P is not the deployment's)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    order = Window.partitionBy("partition").orderBy("first_fired_at", "epoch", "instance")
    known = term_rows.filter(F.col("epoch").isNotNull() & F.col("instance").isNotNull())
    steps = known.select(
        "partition",
        F.lag("instance").over(order).alias("from_instance"),
        F.lag("epoch").over(order).alias("from_epoch"),
        F.lag("last_fired_at").over(order).alias("last_fired_at"),
        F.col("instance").alias("to_instance"),
        F.col("epoch").alias("to_epoch"),
        "first_fired_at",
    ).filter(F.col("from_epoch").isNotNull())
    gap = (F.unix_micros("first_fired_at") - F.unix_micros("last_fired_at")) / F.lit(1000)
    return (
        steps.withColumn("gap_ms", F.floor(gap).cast("long"))
        .withColumn("moved", F.col("from_instance") != F.col("to_instance"))
        .withColumn("suspect", _suspect())
    )


def _suspect() -> Any:
    """A handover no working fence makes: two instances' terms with one number (term numbers
    are unique, migration 0028), an instance's next term not above its previous one (each
    take issues a number above every one before), or fires overlapping in time. A partition
    moving to another instance's term may go to a lower number: a running term that gained
    it in place (docs/leadership.md, "A term that grows") keeps the number it took before."""
    from pyspark.sql import functions as F

    to, was = F.col("to_epoch"), F.col("from_epoch")
    return (to == was) | (~F.col("moved") & (to < was)) | (F.col("gap_ms") < 0)


def neighbourhoods(steps: Any, margin: timedelta, window: AuditWindow) -> Any:
    """Around each handover, the due times `margin` or less from its gap: `lo_us`..`hi_us`
    (µs since the epoch, both included), cut to the audited window; with the handover's key
    (`partition`, `to_epoch`, `to_instance`)."""
    from pyspark.sql import functions as F

    pad = int(margin / timedelta(microseconds=1))
    last, first = F.unix_micros("last_fired_at"), F.unix_micros("first_fired_at")
    lo = F.greatest(F.least(last, first) - F.lit(pad), F.lit(to_us(window.start)))
    hi = F.least(F.greatest(last, first) + F.lit(pad), F.lit(to_us(window.end)))
    return steps.select(*HANDOVER, lo.alias("lo_us"), hi.alias("hi_us"))


def covered(hoods: Any) -> Any:
    """One row, `covered_us`: how much partition-time the neighbourhoods cover, overlaps
    counted once (per partition, each interval adds what lies past every earlier one)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    earlier = (
        Window.partitionBy("partition")
        .orderBy("lo_us", "hi_us")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    reach = F.max("hi_us").over(earlier)
    start = F.greatest(F.col("lo_us"), F.coalesce(reach, F.col("lo_us")))
    new = F.greatest(F.col("hi_us") - start, F.lit(0))
    return hoods.select(new.alias("new")).agg(
        F.coalesce(F.sum("new"), F.lit(0)).cast("long").alias("covered_us")
    )


def faults(occ: Any, count: int) -> Any:
    """The occurrences a handover can explain (late, missed or doubled; manual fires have no
    due time), with their partition and due time in µs."""
    from pyspark.sql import functions as F

    flagged = F.col("late") | F.col("missed") | F.col("doubled")
    return occ.filter((F.col("kind") != "manual") & flagged).select(
        partition_column(F.col("key"), count).alias("partition"),
        F.unix_micros("due_at").alias("due_us"),
        *FAULTS,
    )


def _near(fault_rows: Any, hoods: Any, how: str) -> Any:
    """`fault_rows` joined to the neighbourhoods (broadcast: a day has few handovers) of their own
    partition that hold their due time."""
    from pyspark.sql import functions as F

    nearby = F.broadcast(hoods.withColumnRenamed("partition", "h_partition"))
    due = F.col("due_us")
    inside = (F.col("partition") == F.col("h_partition")) & (due >= F.col("lo_us"))
    return fault_rows.join(nearby, inside & (due <= F.col("hi_us")), how)


def _sums(suffix: str = "") -> list[Any]:
    from pyspark.sql import functions as F

    return [F.coalesce(F.sum(F.col(f).cast("long")), F.lit(0)).alias(f + suffix) for f in FAULTS]


def fault_counts(fault_rows: Any, hoods: Any) -> Any:
    """One row: `late`, `missed`, `doubled` in the whole window, and `late_near`,
    `missed_near`, `doubled_near`: those due in the neighbourhood of a handover of their
    partition (each occurrence once, however many neighbourhoods hold it)."""
    near = _near(fault_rows, hoods, "left_semi")
    return fault_rows.agg(*_sums()).crossJoin(near.agg(*_sums("_near")))


def per_handover(steps: Any, fault_rows: Any, hoods: Any) -> Any:
    """The handovers with `late_near`, `missed_near` and `doubled_near`: the faults due in each
    one's own neighbourhood (an occurrence near two handovers counts for both)."""
    from pyspark.sql import functions as F

    near = (
        _near(fault_rows, hoods, "inner")
        .groupBy(F.col("h_partition").alias("partition"), "to_epoch", "to_instance")
        .agg(*_sums("_near"))
    )
    joined = steps.join(near, list(HANDOVER), "left")
    return joined.fillna(0, subset=[f"{f}_near" for f in FAULTS])


def counts(term_rows: Any, steps: Any) -> Any:
    """One row: `handovers`, `moves`, `suspect`, `gap_p50_ms`, `gap_max_ms`, `terms` (distinct
    (epoch, instance) pairs) and `unattributed` (fires without an epoch or an instance)."""
    from pyspark.sql import functions as F

    unknown = F.col("epoch").isNull() | F.col("instance").isNull()
    of_terms = term_rows.agg(
        F.count_distinct("epoch", "instance").alias("terms"),
        F.coalesce(F.sum(F.when(unknown, F.col("fires"))), F.lit(0)).alias("unattributed"),
    )
    of_handovers = steps.agg(
        F.count(F.lit(1)).alias("handovers"),
        F.coalesce(F.sum(F.col("moved").cast("long")), F.lit(0)).alias("moves"),
        F.coalesce(F.sum(F.col("suspect").cast("long")), F.lit(0)).alias("suspect"),
        F.expr("percentile(gap_ms, 0.5)").alias("gap_p50_ms"),
        F.max("gap_ms").alias("gap_max_ms"),
    )
    return of_terms.crossJoin(of_handovers)


def per_hour(steps: Any) -> Any:
    """Handovers per UTC hour of the new term's first fire: `hour_us` (the hour's start, µs
    since the epoch), `handovers`."""
    from pyspark.sql import functions as F

    hour = F.floor(F.unix_micros("first_fired_at") / F.lit(HOUR_US)) * F.lit(HOUR_US)
    grouped = steps.groupBy(hour.cast("long").alias("hour_us"))
    return grouped.agg(F.count(F.lit(1)).alias("handovers")).orderBy("hour_us")
