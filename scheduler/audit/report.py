"""`report.html`: one self-contained page a person reads in the morning.

The SLO verdict first (a summary: breaches per kind, the worst ten, the rest folded away), then
the totals and the worst offenders, lateness over the day (handovers marked) and its
distribution (matplotlib PNGs embedded as data URIs), the handovers and the faults near them,
a table per schedule, per subject and per hour, and the audit's own inputs. No external
assets: the file can be mailed or archived as it is. Tables and numbers: `markup`; the
handovers' section: `handover_report`.
"""

from __future__ import annotations

import base64
import io
import itertools
from html import escape
from typing import Any

from scheduler.audit import handover_report
from scheduler.audit.markup import table as _table
from scheduler.audit.summary import BUCKETS

WORST = 10
STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
h1{margin-bottom:.2em} h2{margin-top:1.6em;border-bottom:1px solid #ddd}
.verdict{padding:.8em 1em;border-radius:6px;margin:1em 0;overflow-wrap:anywhere}
.verdict .head{font-size:1.3em;margin:0 0 .3em} .verdict p{margin:.4em 0}
.verdict ol,.verdict ul{margin:.3em 0;padding-left:1.4em} .verdict summary{cursor:pointer}
.kinds{display:flex;flex-wrap:wrap;gap:.3em 1.2em;list-style:none;padding:0!important}
.ok{background:#e6f4ea;border:1px solid #8bc79b} .bad{background:#fdecea;border:1px solid #e59a93}
.note{padding:.5em .8em;border-radius:6px}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;margin:.5em 0;font-size:13px}
th,td{padding:3px 9px;border-bottom:1px solid #eee;text-align:right}
th{background:#f6f6f6;position:sticky;top:0} td.l,th.l{text-align:left}
td.l:first-child{white-space:nowrap}
tr.breach td{background:#fff3f2} .muted{color:#777} img{max-width:100%;height:auto}
@media (max-width:600px){body{margin:1em auto;padding:0 .6em} .verdict{padding:.6em .7em}}
"""
COUNTS = ("expected", "fired", "missed", "doubled", "early", "late", "unexpected")
SUBJECT_COUNTS = ("fired", "missed", "doubled", "early", "late", "overdue", "dead", "expired")


def render(summary: dict[str, Any], run: dict[str, Any]) -> str:
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>Drift audit {escape(summary['date'])}</title><style>{STYLE}</style></head><body>",
        f"<h1>Drift audit {escape(summary['date'])}</h1>",
        f"<p class='muted'>window {escape(summary['window']['start'])} to "
        f"{escape(summary['window']['end'])} (UTC)</p>",
        _verdict(summary),
        "<h2 id='totals'>Totals</h2>",
        _totals(summary),
        _worst(summary),
        "<h2>Lateness over the day</h2>",
        _img(_plot_series(run.get("series") or [], summary)),
        "<h2>Lateness distribution</h2>",
        _img(_plot_histogram(run.get("histogram") or [])),
        handover_report.section(summary),
        "<h2 id='schedules'>Schedules</h2>",
        _schedule_table(summary),
        "<h2 id='subjects'>Subjects</h2>",
        _subject_table(summary),
        "<h2>Per hour (UTC)</h2>",
        _hour_table(run.get("hours") or []),
        "<h2>About this audit</h2>",
        _inputs(summary, run),
        "</body></html>",
    ]
    return "\n".join(parts)


def _verdict(summary: dict[str, Any]) -> str:
    """The verdict box: met, or breached with the count per kind of fault, the worst ten
    breaches and the rest in a folded list (205 lines used to push everything else a page
    height down)."""
    slo = summary["slo"]
    rule = (
        f"lateness p99 &le; {slo['lateness_p99_ms']} ms per schedule and subject; no missed, "
        "doubled, early or overdue run"
    )
    if slo["ok"]:
        return f"<div class='verdict ok' id='verdict'><b>SLO met.</b> {rule}.</div>"
    ranked = _ranked_breaches(summary)
    schedules = sum(1 for name in ranked if name in summary["schedules"])
    subjects = sum(1 for name in ranked if name in summary["subjects"])
    parts = [
        f"<div class='verdict bad' id='verdict'><p class='head'><b>SLO breached</b> by "
        f"{len(ranked):,}: {schedules:,} schedule(s), {subjects:,} subject(s).</p>",
        f"<p class='muted'>{rule}.</p>",
        _kind_counts(slo["reasons"]),
        f"<p>{'The worst ten' if len(ranked) > WORST else 'Each'}, by faults then p99:</p>",
        _breach_list("ol", ranked[:WORST], slo["reasons"]),
    ]
    if rest := ranked[WORST:]:
        parts += [
            f"<details><summary>The other {len(rest):,} breach(es)</summary>",
            _breach_list("ul", rest, slo["reasons"]),
            "</details>",
        ]
    parts.append(
        "<p><a href='#schedules'>Every schedule</a> and <a href='#subjects'>every "
        "subject</a> are in the tables below.</p></div>"
    )
    return "".join(parts)


def _ranked_breaches(summary: dict[str, Any]) -> list[str]:
    """Breaching names, worst first (faults, then p99), by name among equals."""

    def badness(name: str) -> tuple[int, float]:
        entries = [t[name] for t in (summary["schedules"], summary["subjects"]) if name in t]
        return max((_badness(e) for e in entries), default=(0, 0.0))

    names = sorted(summary["slo"]["breaches"])
    return sorted(names, key=badness, reverse=True)


def _kind_counts(reasons: dict[str, list[str]]) -> str:
    """How many breaches have each kind of fault, and how many runs or tasks that is."""
    breaches: dict[str, int] = {}
    runs: dict[str, int] = {}
    for why in reasons.values():
        for reason in why:
            count, _, kind = reason.partition(" ")
            if kind.isalpha() and count.isdigit():
                runs[kind] = runs.get(kind, 0) + int(count)
            else:
                kind = "lateness p99 over the SLO"
            breaches[kind] = breaches.get(kind, 0) + 1
    items = "".join(
        f"<li><b>{escape(kind)}</b> {n:,}"
        + (f" ({runs[kind]:,})" if kind in runs else "")
        + "</li>"
        for kind, n in sorted(breaches.items(), key=lambda kv: (-kv[1], kv[0]))
    )
    return f"<p>Breaches per kind of fault (runs or tasks):</p><ul class='kinds'>{items}</ul>"


def _breach_list(tag: str, names: list[str], reasons: dict[str, list[str]]) -> str:
    items = "".join(
        f"<li><b>{escape(name)}</b>: {escape('; '.join(reasons[name]))}</li>" for name in names
    )
    return f"<{tag}>{items}</{tag}>"


def _late_cells(entry: dict[str, Any]) -> list[Any]:
    lat = entry["lateness_ms"]
    return [lat["p50"], lat["p95"], lat["p99"], lat["max"]]


def _totals(summary: dict[str, Any]) -> str:
    rows = []
    for kind, entry in summary["totals"].items():
        counts = [entry.get(c) for c in (*COUNTS, "overdue", "dead", "expired")]
        rows.append([kind, *counts, *_late_cells(entry)])
    headers = ["kind", *COUNTS, "overdue", "dead", "expired", "p50 ms", "p95 ms", "p99 ms"]
    return _table([*headers, "max ms"], rows)


def _badness(entry: dict[str, Any]) -> tuple[int, float]:
    faults = sum(entry.get(c, 0) for c in ("missed", "doubled", "early", "overdue"))
    return faults, entry["lateness_ms"]["p99"] or 0.0


def _worst(summary: dict[str, Any]) -> str:
    ranked = sorted(
        [("schedule", n, e) for n, e in summary["schedules"].items()]
        + [("subject", n, e) for n, e in summary["subjects"].items()],
        key=lambda item: _badness(item[2]),
        reverse=True,
    )[:WORST]
    rows = [
        [
            name,
            what,
            *(e.get(c) for c in ("missed", "doubled", "early", "overdue", "late")),
            e["lateness_ms"]["p99"],
            e["lateness_ms"]["max"],
        ]
        for what, name, e in ranked
        if _badness(e) != (0, 0.0)
    ]
    if not rows:
        return (
            "<h2 id='worst'>Worst offenders</h2><p>None: nothing was late, missed or doubled.</p>"
        )
    headers = ["name", "is a", "missed", "doubled", "early", "overdue", "late", "p99 ms", "max ms"]
    breached = set(summary["slo"]["breaches"])
    return "<h2 id='worst'>Worst offenders</h2>" + _table(
        headers, rows, [r[0] in breached for r in rows]
    )


def _schedule_table(summary: dict[str, Any]) -> str:
    items = sorted(summary["schedules"].items(), key=lambda kv: _badness(kv[1]), reverse=True)
    rows = [[n, e["subject"], *(e[c] for c in COUNTS), *_late_cells(e)] for n, e in items]
    breached = set(summary["slo"]["breaches"])
    headers = ["schedule", "subject", *COUNTS, "p50 ms", "p95 ms", "p99 ms", "max ms"]
    return _table(headers, rows, [r[0] in breached for r in rows])


def _subject_table(summary: dict[str, Any]) -> str:
    items = sorted(summary["subjects"].items(), key=lambda kv: _badness(kv[1]), reverse=True)
    rows = [
        [
            n,
            e["by_kind"]["cron"],
            e["by_kind"]["delayed"],
            *(e[c] for c in SUBJECT_COUNTS),
            *_late_cells(e),
        ]
        for n, e in items
    ]
    breached = set(summary["slo"]["breaches"])
    headers = ["subject", "cron", "delayed", *SUBJECT_COUNTS, "p50 ms", "p95 ms", "p99 ms"]
    return _table([*headers, "max ms"], rows, [r[0] in breached for r in rows])


def _hour_table(hours: list[dict[str, Any]]) -> str:
    rows = [
        [
            f"{h['hour']:02d}:00 {h['kind']}",
            h["expected"],
            h["fired"],
            h["missed"],
            h["doubled"],
            h["early"],
            h["late"],
            h["overdue"],
            h["p50"],
            h["p99"],
            h["max"],
        ]
        for h in hours
    ]
    headers = ["hour", "expected", "fired", "missed", "doubled", "early", "late", "overdue"]
    return _table([*headers, "p50 ms", "p99 ms", "max ms"], rows)


def _inputs(summary: dict[str, Any], run: dict[str, Any]) -> str:
    stats = summary["input"]
    invalid = ", ".join(f"{n:,} {why}" for why, n in stats["invalid_reasons"].items()) or "none"
    rows = [
        ["date", summary["date"]],
        ["log", f"{run.get('input')} ({run.get('format')})"],
        ["records read", f"{stats['records']:,}"],
        ["in the window", f"{stats['in_window']:,}"],
        ["outside the window", f"{stats['outside_window']:,}"],
        ["invalid records", invalid],
        ["expected occurrences from", summary["expected_from"]],
        ["jobs", f"{summary['jobs']:,}"],
        *handover_report.input_rows(summary),
        ["late above", f"{summary['slo']['late_ms']} ms"],
        ["percentiles", summary["percentiles"]],
        ["Spark", f"{run.get('spark')} on {run.get('master')}"],
        ["time taken", f"{run.get('seconds', 0):.1f} s ({_stages(run)})"],
    ]
    body = "".join(
        f"<tr><td class='l'>{escape(k)}</td><td class='l'>{escape(str(v))}</td></tr>"
        for k, v in rows
    )
    return f"<div class='scroll'><table>{body}</table></div>"


def _stages(run: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:.1f} s" for k, v in (run.get("stages_seconds") or {}).items())


# --- Plots ----------------------------------------------------------------------------------------


def _figure() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 3.4), dpi=90)
    return fig, ax


def _png(fig: Any) -> str:
    from matplotlib import pyplot as plt

    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


def _img(data: str | None) -> str:
    if data is None:
        return "<p class='muted'>No deliveries to plot.</p>"
    return f"<img alt='plot' src='data:image/png;base64,{data}'>"


def _plot_series(series: list[dict[str, Any]], summary: dict[str, Any]) -> str | None:
    if not series:
        return None
    fig, ax = _figure()
    hours = [row["minute"] / 60 for row in series]
    for key, width, alpha in (("max", 0.7, 0.5), ("p99", 0.9, 0.9), ("p50", 0.9, 0.9)):
        values = [max(row[key], 0.1) for row in series]
        ax.plot(hours, values, label=key, linewidth=width, alpha=alpha)
    for index, at in enumerate(handover_report.hours_from_start(summary)):
        label = "handover" if index == 0 else None
        ax.axvline(at, color="grey", linestyle=":", linewidth=0.8, alpha=0.7, label=label)
    ax.axhline(
        summary["slo"]["lateness_p99_ms"],
        color="red",
        linestyle="--",
        linewidth=0.8,
        label="SLO p99",
    )
    ax.set_yscale("log")
    ax.set_xlabel("hour of the window (UTC)")
    ax.set_ylabel("lateness per minute, ms")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    return _png(fig)


def _plot_histogram(buckets: list[dict[str, Any]]) -> str | None:
    if not buckets:
        return None
    fig, ax = _figure()
    counts = {b["bucket"]: b["count"] for b in buckets}
    edges = [-1, *BUCKETS]
    labels = ["early", *(f"{lo}-{hi}" for lo, hi in itertools.pairwise(BUCKETS)), f">{BUCKETS[-1]}"]
    ax.bar(range(len(edges)), [counts.get(e, 0) for e in edges], color="#4c72b0")
    ax.set_xticks(range(len(edges)), labels, fontsize=7, rotation=30)
    ax.set_yscale("log")
    ax.set_xlabel("lateness of the first delivery, ms")
    ax.set_ylabel("occurrences")
    ax.grid(alpha=0.3, axis="y")
    return _png(fig)
