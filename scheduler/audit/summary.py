"""From aggregated counts to `summary.json` and the SLO verdict (docs/drift-audit.md, "What
each count means"). Pure.

The Spark job hands over one plain row per schedule, per subject and per kind; this module
shapes them into the document, judges the SLO and says why each breach is one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from scheduler.audit.expected import from_us

# Percentiles are exact: Spark's `percentile` over whole milliseconds, interpolating linearly
# between the two closest ranks (numpy's default method).
PERCENTILE_METHOD = "exact (linear interpolation between closest ranks, whole milliseconds)"
# Lateness histogram bucket edges, ms (a bucket holds [edge, next edge)); -1 holds early ones.
BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000)
SCHEDULE_COUNTS: tuple[str, ...]
SUBJECT_COUNTS: tuple[str, ...]
KIND_COUNTS: tuple[str, ...]
SCHEDULE_COUNTS = ("expected", "fired", "missed", "doubled", "early", "late", "unexpected")
SCHEDULE_COUNTS += ("manual",)
SUBJECT_COUNTS = ("fired", "early", "late", "missed", "doubled", "overdue", "dead", "expired")
SUBJECT_COUNTS += ("manual",)
KIND_COUNTS = ("expected", "fired", "delivered", "missed", "doubled", "early", "late")
KIND_COUNTS += ("unexpected", "overdue", "dead", "expired", "manual")
# A fault is *near* a handover when its due time lies this close to the handover's gap.
DEFAULT_HANDOVER_MARGIN = timedelta(seconds=10)
LISTED_HANDOVERS = 1000  # summary.json lists the first ones; the Parquet table holds them all
HANDOVER_FAULTS = ("late", "missed", "doubled")  # what a handover can cause (early: a clock)


@dataclass(frozen=True, slots=True)
class Slo:
    """Lateness p99 each schedule and subject must stay at or under; the per-delivery lateness
    above which a delivery counts as late."""

    lateness_p99_ms: int = 1000
    late_ms: int = 1000


def lateness(row: dict[str, Any]) -> dict[str, Any]:
    """The `lateness_ms` block of a row: p50, p95, p99, max and mean (None without deliveries)."""

    return {k: _number(row.get(k)) for k in ("p50", "p95", "p99", "max", "mean")}


def _number(value: Any) -> float | int | None:
    """A count or a time in ms as JSON shows it: None, or rounded to 3 digits, whole if it is."""
    if value is None:
        return None
    rounded = round(float(value), 3)
    return int(rounded) if rounded.is_integer() else rounded


def _counts(row: dict[str, Any], names: tuple[str, ...]) -> dict[str, int]:
    return {name: int(row.get(name) or 0) for name in names}


def schedule_entry(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "subject": row.get("subject"),
        **_counts(row, SCHEDULE_COUNTS),
        "lateness_ms": lateness(row),
    }


def subject_entry(row: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = _counts(row, SUBJECT_COUNTS)
    entry["lateness_ms"] = lateness(row)
    entry["by_kind"] = {"cron": int(row.get("cron") or 0), "delayed": int(row.get("delayed") or 0)}
    return entry


SCHEDULE_FAULTS = ("missed", "doubled", "early")
SUBJECT_FAULTS = ("early", "doubled", "overdue")


def problems(entry: dict[str, Any], slo: Slo, faults: tuple[str, ...]) -> list[str]:
    """Why an entry breaks the SLO: p99 over the limit, or any of `faults` counted (a schedule:
    missed, doubled or early runs; a subject: early, doubled or overdue deliveries)."""
    found = _p99_problem(entry, slo)
    found += [f"{entry[count]} {count}" for count in faults if entry[count]]
    return found


def _p99_problem(entry: dict[str, Any], slo: Slo) -> list[str]:
    p99 = entry["lateness_ms"]["p99"]
    if p99 is not None and p99 > slo.lateness_p99_ms:
        return [f"lateness p99 {p99} ms > {slo.lateness_p99_ms} ms"]
    return []


def _by(field: str) -> Any:
    return lambda row: row[field]


def build(
    day: str,
    slo: Slo,
    schedules: list[dict[str, Any]],
    subjects: list[dict[str, Any]],
    kinds: list[dict[str, Any]],
    extra: dict[str, Any],
    jobs: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The whole `summary.json` document, schedules and subjects sorted by name; `jobs` (name ->
    subject) adds the jobs that expected nothing in the window and fired nothing, as zeros."""
    known = {r["key"] for r in schedules}
    idle = [{"key": n, "subject": s} for n, s in (jobs or {}).items() if n not in known]
    by_schedule = {r["key"]: schedule_entry(r) for r in sorted([*schedules, *idle], key=_by("key"))}
    by_subject = {r["subject"]: subject_entry(r) for r in sorted(subjects, key=_by("subject"))}
    reasons: dict[str, list[str]] = {}
    for name, entry in by_schedule.items():
        if why := problems(entry, slo, SCHEDULE_FAULTS):
            reasons[name] = why
    for name, entry in by_subject.items():
        if why := problems(entry, slo, SUBJECT_FAULTS):
            reasons.setdefault(name, []).extend(why)
    totals = {
        r["kind"]: {**_counts(r, KIND_COUNTS), "lateness_ms": lateness(r)}
        for r in sorted(kinds, key=lambda r: r["kind"])
    }
    return {
        "date": day,
        "slo": {
            "lateness_p99_ms": slo.lateness_p99_ms,
            "late_ms": slo.late_ms,
            "ok": not reasons,
            "breaches": list(reasons),
            "reasons": reasons,
        },
        "schedules": by_schedule,
        "subjects": by_subject,
        "totals": totals,
        "percentiles": PERCENTILE_METHOD,
        **extra,
    }


@dataclass(frozen=True, slots=True)
class Partitioning:
    """The partition count the audit assigned deliveries by, and where it came from
    (`--partitions`, the database's `partitioning` table, or the default of 1)."""

    count: int = 1
    source: str = "default"


def _rfc3339(us: int) -> str:
    return from_us(us).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _handover_entry(row: dict[str, Any]) -> dict[str, Any]:
    entry = {
        "partition": int(row["partition"]),
        "from_instance": row["from_instance"],
        "from_epoch": int(row["from_epoch"]),
        "last_fired_at": _rfc3339(row["last_fired_us"]),
        "to_instance": row["to_instance"],
        "to_epoch": int(row["to_epoch"]),
        "first_fired_at": _rfc3339(row["first_fired_us"]),
        "gap_ms": int(row["gap_ms"]),
        "moved": bool(row["moved"]),
        "suspect": bool(row["suspect"]),
    }
    entry.update({f"{f}_near": int(row.get(f"{f}_near") or 0) for f in HANDOVER_FAULTS})
    return entry


def handover_summary(
    partitioning: Partitioning,
    margin: timedelta,
    window_us: int,
    tables: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    """The `handovers` block of `summary.json` from the handover stage's rows: `counts`,
    `faults` and `covered` (one row each), `hours`, and `listed` (the first handovers in the
    order of the new term's first fire; times in µs)."""
    counted = tables["counts"][0]
    total = int(counted.get("handovers") or 0)
    moves = int(counted.get("moves") or 0)
    listed = [_handover_entry(r) for r in tables["listed"][:LISTED_HANDOVERS]]
    return {
        "partitions": partitioning.count,
        "partitions_from": partitioning.source,
        "count": total,
        "leader_changes": total if partitioning.count == 1 else None,
        "moves": moves,
        "term_restarts": total - moves,
        "suspect": int(counted.get("suspect") or 0),
        "terms": int(counted.get("terms") or 0),
        "unattributed": int(counted.get("unattributed") or 0),
        "gap_ms": {
            "p50": _number(counted.get("gap_p50_ms")),
            "max": _number(counted.get("gap_max_ms")),
        },
        "per_hour": {_hour(r["hour_us"]): int(r["handovers"]) for r in tables["hours"]},
        "near": _near(tables["faults"][0], tables["covered"][0], partitioning, margin, window_us),
        "list": listed,
        "unlisted": total - len(listed),
    }


def _hour(us: int) -> str:
    return _rfc3339(us)[:13] + ":00Z"


def _near(
    faults: dict[str, Any],
    covered: dict[str, Any],
    partitioning: Partitioning,
    margin: timedelta,
    window_us: int,
) -> dict[str, Any]:
    """How many late, missed and doubled occurrences were due near a handover, of all, and
    the share of the audited partition-time those neighbourhoods cover (the share the faults
    would have if handovers had nothing to do with them)."""
    span = partitioning.count * window_us
    share = round(int(covered.get("covered_us") or 0) / span, 6) if span > 0 else 0.0
    near: dict[str, Any] = {"margin_seconds": margin.total_seconds(), "share_of_time": share}
    for fault in HANDOVER_FAULTS:
        near[fault] = {
            "near": int(faults.get(f"{fault}_near") or 0),
            "all": int(faults.get(fault) or 0),
        }
    return near
