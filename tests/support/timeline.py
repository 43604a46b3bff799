"""Where late tasks spent their time: the daemons' trace lines (`scheduler.engine.delayed.trace`,
written at DEBUG) joined with the producer's own times and the target stream's store times.

One row per task, every time in ms relative to its due time (negative: before it fell due):
`sent` and `ack` the producer's first send and its PubAck from the lane, `lane` the lane's store
time, then the daemon's steps `taken`, `stored`, `claimed`, `out` (handed to the publisher),
`answered`, and `target` (the target stream's store time): the column where the number jumps
is where the task waited.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

LINE = re.compile(r"trace\.(\w+) at=(\d+)(?:.*?) ids=(\S*)")
STEPS = ("taken", "stored", "claimed", "sent", "acked")


@dataclass
class Traced:
    """One task's steps in the daemons' trace: wall ms of each step's first time (`lane`: its
    store time on the lane), and where intake took it (log name:stream seq/consumer seq/
    deliveries; consumer seq 0: read back from the stream)."""

    at: dict[str, float] = field(default_factory=dict)
    where: str = "-"


def read_trace(logs: Iterable[Path]) -> dict[str, Traced]:
    """{task id: Traced} from the daemons' log files (missing files are skipped)."""
    out: dict[str, Traced] = {}
    for path in logs:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for m in LINE.finditer(text):
            step, at, ids = m.group(1), float(m.group(2)), m.group(3)
            for item in ids.split(",") if ids else ():
                task_id, _, mark = item.partition("@")
                row = out.setdefault(task_id, Traced())
                if step in row.at:
                    continue
                row.at[step] = at
                if step == "taken" and mark:
                    lane, _, seqs = mark.partition("/")
                    row.at["lane"], row.where = float(lane), f"{path.stem}:{seqs}"
                elif step == "acked" and mark:
                    row.at[step] = float(mark.rstrip("!"))
    return out


def timeline(
    ids: Iterable[str],
    due: Mapping[str, float],
    target: Mapping[str, float],
    trace: Mapping[str, Traced],
    producer_sent: Mapping[str, float] | None = None,
    producer_ack: Mapping[str, float] | None = None,
    origin: float = 0.0,
) -> str:
    """A table of `ids` (times in s since the epoch in `due`, `target` and the producer's
    maps): `due` in s since `origin` (the fault), each other column in ms relative to the
    task's due time."""
    head = ("task", "due", "sent", "ack", "lane", "taken", "stored", "claimed", "out", "answered",
            "target", "where")  # fmt: skip
    rows: list[tuple[str, ...]] = [head]
    for task_id in ids:
        base = due[task_id] * 1000
        row = trace.get(task_id, Traced())

        def rel(ms: float | None, base: float = base) -> str:
            return "-" if ms is None else f"{ms - base:+.0f}"

        def rel_s(s: float | None) -> str:
            return rel(None if s is None else s * 1000)

        rows.append(
            (task_id, f"{due[task_id] - origin:+.3f}",
             rel_s((producer_sent or {}).get(task_id)), rel_s((producer_ack or {}).get(task_id)),
             rel(row.at.get("lane")), *(rel(row.at.get(s)) for s in STEPS),
             rel_s(target.get(task_id)), row.where)
        )  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
