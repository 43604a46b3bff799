"""The drift audit's report.html with ~200 breaches and 40 handovers in headless Chromium at 1,280
and 390 px: the verdict is a summary (counts per kind, the worst ten, the rest folded), the
totals are on the first screens, and nothing makes the page scroll sideways. No Spark: the
report renders from the summary the job would build (`summary.build`), as the job does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser

from scheduler.audit.report import render
from scheduler.audit.summary import Slo, build
from tests.browser.conftest import HEIGHT, WIDTHS

SCHEDULES, SUBJECTS = 150, 55  # 205 breaches, as in the issue
LAYOUT_JS = """() => {
  const top = (sel) => { const e = document.querySelector(sel);
    return e ? e.getBoundingClientRect().top + window.scrollY : null; };
  const verdict = document.querySelector('.verdict').getBoundingClientRect();
  const named = [...document.querySelectorAll('.verdict ol li, .verdict details li')];
  const shown = named.filter(e => e.checkVisibility());
  const imgs = [...document.querySelectorAll('img')].map(e => e.getBoundingClientRect().width);
  return {scrollWidth: document.documentElement.scrollWidth, width: window.innerWidth,
          height: document.documentElement.scrollHeight, verdict: verdict.height,
          totals: top('#totals'), worst: top('#worst'), named: named.length, shown: shown.length,
          imgs};
}"""


def row(key: str, subject: str, **counts: Any) -> dict[str, Any]:
    base = {"key": key, "subject": subject, "p50": 3.0, "p95": 9.0, "p99": 40.0, "max": 60}
    return {**base, "mean": 5.0, "expected": 1440, "fired": 1440, **counts}


def breaching_summary() -> dict[str, Any]:
    """150 schedules and 55 subjects that breach (missed runs, doubles, a p99 over the SLO, early
    runs, overdue tasks), with long names as real ones are."""
    schedules, subjects = [], []
    for i in range(SCHEDULES):
        name = f"billing-reconciliation-europe-west-{i:03d}-nightly-ledger-export"
        faults: list[dict[str, Any]] = [
            {"missed": i % 7 + 1},
            {"doubled": 2},
            {"p99": 1500.0 + i},
            {"early": 1},
        ]
        schedules.append(
            row(name, f"mq.scheduled.billing.reconcile.{i % SUBJECTS}", **faults[i % 4])
        )
    for i in range(SUBJECTS):
        faults = [{"overdue": i + 1}, {"p99": 2500.0}, {"doubled": 1}]
        subjects.append(
            {**row("", f"mq.scheduled.billing.reconcile.{i}", **faults[i % 3]), "cron": 9}
        )
    extra = {
        "window": {"start": "2026-11-21T00:00:00Z", "end": "2026-11-22T00:00:00Z"},
        "input": {
            "records": 1_000_000,
            "in_window": 999_990,
            "outside_window": 10,
            "invalid": 0,
            "invalid_reasons": {},
        },
        "expected_from": "schedule_history",
        "jobs": SCHEDULES,
    }
    kinds = [{"kind": "cron", **row("", "", missed=400)}, {"kind": "delayed", **row("", "")}]
    return build("2026-11-21", Slo(), schedules, subjects, kinds, extra | {"handovers": moves()})


def moves() -> dict[str, Any]:
    """40 handovers among 64 partitions between engines with pod-length names, one suspect."""
    engine = "mq-scheduler-engine-7f9c8d6b5-x2k4p-europe-west-{}".format
    listed = [
        {"partition": i, "from_instance": engine(i % 3), "from_epoch": 1000 + i}
        | {"last_fired_at": f"2026-11-21T{i % 24:02d}:00:00.000Z", "to_instance": engine(i % 5)}
        | {"to_epoch": 2000 + i, "first_fired_at": f"2026-11-21T{i % 24:02d}:00:03.500Z"}
        | {"gap_ms": 3500, "moved": i % 2 == 0, "suspect": i == 7, "late_near": i}
        | {"missed_near": 1, "doubled_near": 0}
        for i in range(40)
    ]
    near = {f: {"near": 40, "all": 400} for f in ("late", "missed", "doubled")}
    return {
        "partitions": 64,
        "partitions_from": "partitioning table",
        "count": 40,
        "leader_changes": None,
        "moves": 20,
        "term_restarts": 20,
        "suspect": 1,
        "terms": 41,
        "unattributed": 12,
        "gap_ms": {"p50": 3500, "max": 3500},
        "per_hour": {f"2026-11-21T{h:02d}:00Z": 2 for h in range(20)},
        "near": {"margin_seconds": 10.0, "share_of_time": 0.000163} | near,
        "list": listed,
        "unlisted": 0,
    }


RUN = {
    "input": "jdbc:postgresql://db.internal.example:5432/mq-scheduler-production (user audit)",
    "format": "jdbc",
    "master": "local[2]",
    "spark": "4.3.0",
    "seconds": 40.5,
    "stages_seconds": {"occurrences": 30.0, "aggregates": 9.0},
    "series": [{"minute": m, "p50": 3, "p99": 9 + m % 50, "max": 1200} for m in range(1440)],
    "histogram": [{"bucket": -1, "count": 3}, {"bucket": 2, "count": 900}],
    "hours": [
        {"hour": h, "kind": "cron", "expected": 60_000, "fired": 59_990, "missed": 10}
        | {"doubled": 0, "early": 0, "late": 3, "overdue": 0, "p50": 3.0, "p99": 9.0, "max": 1200}
        for h in range(24)
    ],
}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    summary = breaching_summary()
    assert len(summary["slo"]["breaches"]) == SCHEDULES + SUBJECTS
    path = tmp_path_factory.mktemp("report") / "report.html"
    path.write_text(render(summary, RUN), encoding="utf-8")
    return path


@pytest.mark.parametrize("width", WIDTHS)
async def test_a_report_with_205_breaches_leads_with_a_summary_and_fits_the_width(
    chromium: Browser, report: Path, tmp_path: Path, width: int
) -> None:
    """With 205 breaches the verdict shows counts per kind and the worst ten (the rest folded),
    the totals start within the first two screens, and at 1,280 and 390 px the page never
    scrolls sideways (wide tables scroll in their own box, plots shrink to fit)."""
    context = await chromium.new_context(viewport={"width": width, "height": HEIGHT[width]})
    try:
        page = await context.new_page()
        await page.goto(report.as_uri())
        layout = await page.evaluate(LAYOUT_JS)
        shot = tmp_path / f"report-{width}.png"
        await page.screenshot(path=str(shot), full_page=True)
        await page.screenshot(path=str(tmp_path / f"report-{width}-top.png"))
    finally:
        await context.close()
    assert layout["scrollWidth"] <= layout["width"], layout
    # every breach is named once, the worst ten in view, the other 195 folded away
    assert (layout["named"], layout["shown"]) == (SCHEDULES + SUBJECTS, 10), layout
    assert layout["verdict"] <= HEIGHT[width], layout
    assert layout["totals"] is not None and layout["totals"] < 2 * HEIGHT[width], layout
    assert all(w <= width for w in layout["imgs"]), layout
    print(f"{width} px: {layout}, screenshots in {tmp_path}")
