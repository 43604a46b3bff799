"""report.html: verdict first, names escaped, plots embedded, the audit's inputs at the end."""

from __future__ import annotations

from typing import Any

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
