"""What an engine tells the edge beside it: a folder both can read (`SCHEDULER_RUN_DIR`).

The engine takes no input from outside but the delay lane, NATS KV and PostgreSQL
(docs/architecture.md, "Two roles"), so it serves no HTTP: the edge answers the probes, the
API and the scrapes for both. What the edge needs of the engine beside it (in the same pod, or
the child of `scheduler run`) the engine writes into the run folder, and never reads back:

- `engine.json`: its state, role, epoch, warnings, heap size and connections, rewritten every
  `STATUS_EVERY` seconds and at once when the role changes; the edge reads it for `/readyz`,
  `scheduler.v1.stats` and `GET /v1/leader`'s `self`, and treats one older than `STALE_AFTER`
  as an engine that stopped answering (SIGSTOP, a stuck loop, a crash).
- `engine.prom`: the engine's metrics in Prometheus' text format, rendered every
  `SCHEDULER_METRICS_EXPORT_INTERVAL` whatever the number of scrapers (one render, in a worker
  thread, per interval); the edge serves it beside its own with a `role` label.
- `edge.json` (written by the edge, read by `scheduler run`): where the edge listens, and
  `edge-exit.json`: a paired edge's start-up failure, the one line `scheduler run` prints.

Every file is written whole to a temporary name and renamed, so a reader never sees half of one.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ENGINE_STATUS = "engine.json"
ENGINE_METRICS = "engine.prom"
EDGE_STATUS = "edge.json"
EDGE_EXIT = "edge-exit.json"

STATUS_EVERY = 0.5
STALE_AFTER = 2.0


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that a reader sees the old file or the new one, whole."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_json(path: Path, doc: Mapping[str, Any]) -> None:
    write_atomic(path, json.dumps(doc, separators=(",", ":"), default=str).encode())


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`, or None when there is none (or not one we wrote)."""
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


@dataclass(frozen=True, slots=True)
class EngineReport:
    """The engine's state as the edge shows it (`engine.json`)."""

    instance: str
    state: str  # starting | running | stopping | stopped
    role: str  # leader | standby (campaigning or waiting)
    epoch: int | None
    nats: str  # connected | disconnected | closed
    postgres: str  # migrated | pending
    ready: bool
    heap: int = 0
    warnings: list[str] = field(default_factory=list)
    leader: dict[str, Any] = field(default_factory=dict)  # Leadership.info()
    pid: int = 0
    at: float = 0.0  # time.time() of the write

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> EngineReport | None:
        try:
            return cls(
                instance=str(doc["instance"]),
                state=str(doc["state"]),
                role=str(doc["role"]),
                epoch=doc["epoch"] if isinstance(doc.get("epoch"), int) else None,
                nats=str(doc["nats"]),
                postgres=str(doc["postgres"]),
                ready=bool(doc["ready"]),
                heap=int(doc.get("heap") or 0),
                warnings=[str(w) for w in doc.get("warnings") or []],
                leader=dict(doc.get("leader") or {}),
                pid=int(doc.get("pid") or 0),
                at=float(doc.get("at") or 0.0),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def age(self, now: float | None = None) -> float:
        return (time.time() if now is None else now) - self.at


def read_engine_report(run_dir: Path) -> EngineReport | None:
    doc = read_json(run_dir / ENGINE_STATUS)
    return None if doc is None else EngineReport.from_json(doc)


# -- metrics ---------------------------------------------------------------------------------


def _with_label(line: str, label: str) -> str:
    """A sample line of the text format with `label` (`role="engine"`) added first."""
    cut = len(line)
    for i, ch in enumerate(line):
        if ch in "{ ":
            cut = i
            break
    if line[cut : cut + 1] == "{":
        closing = "" if line[cut + 1 : cut + 2] == "}" else ","
        return line[: cut + 1] + label + closing + line[cut + 1 :]
    return line[:cut] + "{" + label + "}" + line[cut:]


def _families(text: str) -> Iterable[tuple[str, list[str], list[str]]]:
    """(name, header lines, sample lines) per family of an exposition, as
    prometheus_client writes it: `# HELP`, `# TYPE`, then the samples."""
    name, header, samples = "", list[str](), list[str]()
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# HELP "):
            if name:
                yield name, header, samples
            name, header, samples = line.split(" ", 3)[2], [line], []
        elif line.startswith("#"):
            header.append(line)
        else:
            samples.append(line)
    if name:
        yield name, header, samples


def merge_expositions(parts: Iterable[tuple[str, bytes]]) -> bytes:
    """One exposition from several processes' (role, text) pairs: every sample gets a `role`
    label, so the same family from two processes (`process_cpu_seconds_total`,
    `mq_scheduler_is_leader`) stays two series; each family's HELP and TYPE once."""
    merged: dict[str, tuple[list[str], list[str]]] = {}
    for role, data in parts:
        label = f'role="{role}"'
        for name, header, samples in _families(data.decode("utf-8", "replace")):
            held = merged.setdefault(name, (header, []))
            held[1].extend(_with_label(s, label) for s in samples)
    out = []
    for header, samples in merged.values():
        out.extend(header)
        out.extend(samples)
    return ("\n".join(out) + "\n").encode()
