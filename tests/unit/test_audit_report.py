"""report.html: verdict first, names escaped, plots embedded, the handovers, the audit's inputs at
the end."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.audit import handover_report
from scheduler.audit.report import _verdict, render
from scheduler.audit.summary import Slo, build


def summary(**counts: Any) -> dict[str, Any]:
    row = {"key": "<b>job</b>", "subject": "mq.x", "p50": 3.0, "p95": 9.0, "p99": 40.0}
    row.update(max=60, mean=5.0, expected=10, fired=10, **counts)
    extra = {
        "window": {"start": "2026-11-21T00:00:00Z", "end": "2026-11-22T00:00:00Z"},
        "input": {
            "records": 12345,
            "in_window": 12000,
            "outside_window": 345,
            "invalid": 0,
            "invalid_reasons": {},
        },
        "expected_from": "schedules",
        "jobs": 1,
    }
    return build("2026-11-21", Slo(), [row], [], [{"kind": "cron", **row}], extra)


RUN = {
    "input": "/data/log",
    "format": "parquet",
    "master": "local[2]",
    "spark": "4.3.0",
    "seconds": 12.5,
    "stages_seconds": {"occurrences": 8.0, "aggregates": 3.0},
    "series": [{"minute": m, "p50": 3, "p99": 9, "max": 12, "count": 4} for m in range(60)],
    "histogram": [{"bucket": -1, "count": 1}, {"bucket": 2, "count": 9}],
    "hours": [
        {
            "hour": 0,
            "kind": "cron",
            "expected": 10,
            "fired": 10,
            "missed": 0,
            "doubled": 0,
            "early": 0,
            "late": 0,
            "overdue": 0,
            "p50": 3.0,
            "p99": 9.0,
            "max": 12,
        }
    ],
}


def test_breach_is_stated_first_with_reasons_and_names_escaped() -> None:
    """A breach opens the page with the job and why; markup in names is escaped."""
    html = render(summary(missed=2), RUN)
    assert html.index("SLO breached") < html.index("Worst offenders") < html.index("Schedules")
    assert "&lt;b&gt;job&lt;/b&gt;</b>: 2 missed" in html
    assert "<b>job</b>" not in html.replace("<b>SLO", "")


def test_met_slo_plots_and_inputs() -> None:
    """A clean day says so; both plots are embedded PNGs; the inputs list the record count."""
    html = render(summary(), RUN)
    assert "SLO met." in html and "SLO breached" not in html
    assert html.count("src='data:image/png;base64,") == 2
    assert "12,345" in html and "4.3.0 on local[2]" in html and "12.5 s" in html


def test_many_breaches_are_summarised_worst_ten_first_the_rest_folded() -> None:
    """With 25 breaching jobs the verdict counts breaches per kind of fault (and the runs in
    them), lists the ten with the most faults in order and folds the other 15 away."""
    rows = [
        {"key": f"job-{i:02d}", "subject": "mq.x", "p50": 3.0, "p95": 9.0, "p99": 40.0}
        | {"max": 60, "mean": 5.0, "expected": 10, "fired": 10, "missed": i + 1}
        for i in range(24)
    ]
    rows.append(rows[0] | {"key": "slow", "missed": 0, "p99": 1500.0})
    extra = {"window": {}, "input": {}, "expected_from": "schedules", "jobs": 25}
    doc = build("2026-11-21", Slo(), rows, [], [], extra)
    verdict = _verdict(doc)
    assert "by 25: 25 schedule(s), 0 subject(s)." in verdict
    assert "<li><b>missed</b> 24 (300)</li><li><b>lateness p99 over the SLO</b> 1</li>" in verdict
    top, _, folded = verdict.partition("<details>")
    assert [f"job-{i:02d}" for i in range(23, 13, -1)] == [
        name for name in (f"job-{i:02d}" for i in range(24)) if f"<b>{name}</b>" in top
    ][::-1]
    assert "The other 15 breach(es)" in folded and "<b>slow</b>: lateness p99 1500 ms" in folded
    assert "<details>" not in _verdict(build("d", Slo(), rows[:3], [], [], extra))


def handover(at: str, **extra: Any) -> dict[str, Any]:
    base = {"partition": 3, "from_instance": "<i>a</i>", "from_epoch": 4, "to_instance": "b"}
    base |= {"to_epoch": 5, "last_fired_at": "2026-11-21T05:59:58.000Z", "first_fired_at": at}
    base |= {"gap_ms": 2500, "moved": True, "suspect": False}
    return base | {"late_near": 3, "missed_near": 1, "doubled_near": 0} | extra


def with_handovers(partitions: int, listed: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    doc = summary()
    doc["handovers"] = {
        "partitions": partitions,
        "partitions_from": "--partitions",
        "count": len(listed),
        "leader_changes": len(listed) if partitions == 1 else None,
        "moves": len(listed),
        "term_restarts": 0,
        "suspect": 0,
        "terms": len(listed) + 1,
        "unattributed": 0,
        "gap_ms": {"p50": 2500, "max": 2500},
        "per_hour": {"2026-11-21T06:00Z": len(listed)},
        "near": {
            "margin_seconds": 10.0,
            "share_of_time": 0.0025,
            "late": {"near": 3, "all": 4},
            "missed": {"near": 1, "all": 1},
            "doubled": {"near": 0, "all": 0},
        },
        "list": listed,
        "unlisted": 0,
    } | extra
    return doc


def test_handovers_section_says_how_many_and_whether_faults_cluster_near_them() -> None:
    """Under P = 1 the section counts leader changes; it says how many late, missed and
    doubled runs were due near one against the share of time near one, lists each handover
    (instance names escaped) and marks it on the lateness plot."""
    html = render(with_handovers(1, [handover("2026-11-21T06:00:00.500Z")]), RUN)
    section = html[html.index("<h2 id='handovers'>") : html.index("<h2 id='schedules'>")]
    assert "<b>1 leader change(s)</b> (P = 1, from --partitions)" in section
    assert "(those stretches are 0.25% of the audited partition-time)" in section
    assert "<li><b>late</b> 3 of 4</li><li><b>missed</b> 1 of 1</li>" in section
    assert "&lt;i&gt;a&lt;/i&gt; (epoch 4)" in section and "<i>a</i>" not in section
    assert "<td class='l'>2026-11-21T06:00:00.500Z</td><td>3</td>" in section
    assert "suspect" not in section and "<details>" not in section
    assert "<td class='l'>partitions</td><td class='l'>1 (--partitions)</td>" in html
    assert handover_report.hours_from_start(with_handovers(1, [handover("2026-11-21T06:30Z")])) == [
        6.5
    ]


def test_many_handovers_over_partitions_are_folded_and_suspect_ones_flagged() -> None:
    """Under P > 1 the section counts handovers of partitions; more than twenty are folded
    away, suspect ones are called out and their rows marked; too many are not plotted."""
    listed = [handover(f"2026-11-21T06:{m:02d}:00.000Z") for m in range(25)]
    listed[0]["suspect"] = True
    doc = with_handovers(64, listed, suspect=1, count=250, unlisted=225)
    html = render(doc, RUN)
    section = html[html.index("<h2 id='handovers'>") : html.index("<h2 id='schedules'>")]
    assert "<b>250 handover(s)</b> of a partition among P = 64" in section
    assert "1 suspect handover(s)" in section and "<tr class='breach'>" in section
    assert "<details><summary>All 25 listed handovers</summary>" in section
    assert "225 more in the handovers table (Parquet)" in section
    assert handover_report.hours_from_start(doc) == []  # 250 > MARKED
    three = handover_report.hours_from_start(with_handovers(64, listed[:3]))
    assert three == pytest.approx([6.0, 6.0 + 1 / 60, 6.0 + 2 / 60])


def test_a_summary_without_handovers_renders_without_the_section() -> None:
    """A summary written before handovers were counted renders as before."""
    html = render(summary(), RUN)
    assert "id='handovers'" not in html and "<td class='l'>partitions</td>" not in html
