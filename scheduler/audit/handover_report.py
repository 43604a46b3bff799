"""The handovers' section of `report.html` (docs/drift-audit.md, "Handovers"): how many and
of what kind, whether late, missed and doubled runs cluster near them, per hour, and each one;
also where the lateness plot marks them and the partition count among the audit's inputs."""

from __future__ import annotations

from datetime import datetime
from html import escape
from typing import Any

from scheduler.audit.markup import num, table

MARKED = 200  # the lateness plot marks the handovers when there are at most this many
SHOWN = 20  # more handovers than this are listed folded away


def input_rows(summary: dict[str, Any]) -> list[list[str]]:
    """The partition count, and where it came from, for the audit's inputs."""
    block = summary.get("handovers")
    if block is None:
        return []
    return [["partitions", f"{block['partitions']:,} ({block['partitions_from']})"]]


_SOURCES = {
    "--partitions": "from --partitions",
    "partitioning table": "from the database's partitioning table",
    "default": "the default: pass --partitions N for a partitioned deployment",
}
_HANDOVER_HEADERS = ["new term's first fire", "partition", "from", "to", "gap ms", "moved"]
_HANDOVER_HEADERS += ["late near", "missed near", "doubled near"]


def section(summary: dict[str, Any]) -> str:
    """Handovers: how many and of what kind, whether the faults cluster near them, per hour,
    and each one (folded away when there are many)."""
    block = summary.get("handovers")
    if block is None:  # a summary from before handovers were counted
        return ""
    count, partitions = block["count"], block["partitions"]
    source = _SOURCES.get(block["partitions_from"], block["partitions_from"])
    if partitions == 1:
        head = (
            f"<b>{count:,} leader change(s)</b> (P = 1, {escape(source)}): "
            f"{block['moves']:,} to another instance, {block['term_restarts']:,} to a new term "
            "of the same one."
        )
    else:
        head = (
            f"<b>{count:,} handover(s)</b> of a partition among P = {partitions:,} "
            f"({escape(source)}): {block['moves']:,} to another engine, "
            f"{block['term_restarts']:,} to a new term of the same engine."
        )
    gap = block["gap_ms"]
    parts = [
        "<h2 id='handovers'>Handovers</h2>",
        f"<p>{head} {block['terms']:,} term(s) fired; the gap from the old term's last fire to "
        f"the new one's first: p50 {num(gap['p50'])} ms, max {num(gap['max'])} ms.</p>",
        _near(block["near"]),
    ]
    if block["suspect"]:
        parts.append(
            f"<p class='note bad'>{block['suspect']:,} suspect handover(s): two engines' terms "
            "with one epoch, an engine's next term not above its last, or the two terms fired "
            "at overlapping times. Is --partitions "
            "the deployment's count? Do the hosts' clocks agree?</p>"
        )
    if block["unattributed"]:
        parts.append(
            f"<p class='muted'>{block['unattributed']:,} fire(s) without an epoch or an "
            "instance belong to no term.</p>"
        )
    if block["per_hour"]:
        rows = [[hour, n] for hour, n in block["per_hour"].items()]
        parts.append(table(["hour (UTC)", "handovers"], rows))
    parts.append(_handover_list(block))
    return "\n".join(parts)


def _near(near: dict[str, Any]) -> str:
    """Whether late, missed and doubled runs cluster at handovers: how many of each were due
    near one, against the share of the partition-time near one."""
    items = "".join(
        f"<li><b>{fault}</b> {near[fault]['near']:,} of {near[fault]['all']:,}</li>"
        for fault in ("late", "missed", "doubled")
    )
    return (
        f"<p>Runs due within {near['margin_seconds']:g} s of a handover of their partition "
        f"(those stretches are {near['share_of_time']:.2%} of the audited partition-time):</p>"
        f"<ul class='kinds'>{items}</ul>"
    )


def _handover_list(block: dict[str, Any]) -> str:
    rows = [
        [
            h["first_fired_at"],
            h["partition"],
            f"{h['from_instance']} (epoch {h['from_epoch']})",
            f"{h['to_instance']} (epoch {h['to_epoch']})",
            h["gap_ms"],
            "yes" if h["moved"] else "no",
            h["late_near"],
            h["missed_near"],
            h["doubled_near"],
        ]
        for h in block["list"]
    ]
    if not rows:
        return "<p>No handover in the window.</p>"
    listed = table(_HANDOVER_HEADERS, rows, [h["suspect"] for h in block["list"]])
    rest = (
        f"<p class='muted'>{block['unlisted']:,} more in the handovers table (Parquet).</p>"
        if block["unlisted"]
        else ""
    )
    if len(rows) <= SHOWN:
        return listed + rest
    return f"<details><summary>All {len(rows):,} listed handovers</summary>{listed}</details>{rest}"


def hours_from_start(summary: dict[str, Any]) -> list[float]:
    """Where the listed handovers fall on the plot's axis (hours from the window's start);
    none when there are too many to mark."""
    block = summary.get("handovers")
    if block is None or not block["list"] or block["count"] > MARKED:
        return []
    start = datetime.fromisoformat(summary["window"]["start"])
    return [
        (datetime.fromisoformat(h["first_fired_at"]) - start).total_seconds() / 3600
        for h in block["list"]
    ]
