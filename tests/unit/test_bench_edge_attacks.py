"""bench/edge_attacks.py keeps working: its plan, its judgement, its attackers' bounds, and a
smoke run of every vector with phases of one second."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench() -> Iterator[tuple[ModuleType, ModuleType]]:
    """The script and its attackers, imported the way the script imports its neighbours."""
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("edge_attacks"), importlib.import_module("edge_attackers")
    finally:
        sys.path.remove(str(BENCH))


def _phases(ea: ModuleType) -> list[Any]:
    """Quiet, one vector, the quiet after it: one second each from t = 0."""
    names = [("quiet", None), ("unauth_flood", "unauth_flood"), ("after_unauth_flood", None)]
    return [ea.Phase(n, float(i), float(i + 1), v) for i, (n, v) in enumerate(names)]


def test_due_times_and_phases(bench: tuple[ModuleType, ModuleType]) -> None:
    """Due times fall on whole milliseconds at the rate; each lands in its phase's window."""
    ea, _ = bench
    phases = _phases(ea)
    dues = ea.due_times(0.0, 3.0, 300)
    assert len(dues) == 900
    assert all(round(d * 1000) == d * 1000 for d in dues[:50])
    assert Counter(ea.phase_of(d, phases) for d in dues) == {
        "quiet": 300, "unauth_flood": 300, "after_unauth_flood": 300,
    }  # fmt: skip
    assert ea.phase_of(3.0, phases) == "other"


def _run(
    ea: ModuleType, lateness_ms: dict[str, list[float | tuple[float, float] | None]]
) -> tuple[dict[str, Any], Any]:
    """Per-phase results of tasks due 10 ms apart in each phase, stored that late (a None:
    lost; two values: doubled)."""
    phases = _phases(ea)
    expected, stored = {}, {}
    for p in phases:
        for i, late in enumerate(lateness_ms.get(p.name, [])):
            due = p.start + i * 0.01
            expected[f"{p.name}-{i}"] = due
            lates = late if isinstance(late, tuple) else (late,)
            got = [(due + x / 1000, due) for x in lates if x is not None]
            if got:
                stored[f"{p.name}-{i}"] = got
    return ea.classify(expected, stored, phases), [p.name for p in phases]


def test_judge_passes_a_clean_run(bench: tuple[ModuleType, ModuleType]) -> None:
    """Attack p99 within 1.5x quiet and 15 ms, nothing lost, doubled or early, lease kept."""
    ea, _ = bench
    results, order = _run(ea, {"quiet": [2.0] * 50, "unauth_flood": [2.5] * 50})
    results["unauth_flood"]["lease_kept"] = True
    assert ea.judge(results, order) == (True, [])
    assert results["unauth_flood"]["p99_over_quiet"] == 1.25


def test_judge_names_each_miss(bench: tuple[ModuleType, ModuleType]) -> None:
    """A slow attack phase, a lost, a doubled and an early task and a lost lease each fail."""
    ea, _ = bench
    results, order = _run(
        ea,
        {
            "quiet": [2.0] * 50 + [None],
            "unauth_flood": [40.0] * 50 + [(3.0, 5.0)],
            "after_unauth_flood": [-1.0],
        },
    )
    results["unauth_flood"]["lease_kept"] = False
    results["after_unauth_flood"]["exited"] = ["edge-1 (exit 1)"]
    passed, failed = ea.judge(results, order)
    assert not passed
    assert failed == [
        "quiet: lost",
        "unauth_flood: doubled",
        "unauth_flood: p99 20.0x quiet",
        "unauth_flood: p99 40.0 ms",
        "unauth_flood: lease lost",
        "after_unauth_flood: early",
        "after_unauth_flood: daemon exited (edge-1 (exit 1))",
    ]


def test_reply_kinds(bench: tuple[ModuleType, ModuleType]) -> None:
    """NATS replies are tallied by status, error code or service error."""
    _, att = bench
    assert att._reply_kind(b'{"status": "cancelled"}', None) == "cancelled"
    assert att._reply_kind(b'{"error": {"code": "bad_request"}}', None) == "error bad_request"
    assert att._reply_kind(b"{}", {"Nats-Service-Error-Code": "500"}) == "service error 500"
    assert att._reply_kind(b"no", None) == "not json"
    assert att._reply_kind(b'{"pending": 3}', None) == "answered"


async def test_attackers_stop_at_their_deadline(bench: tuple[ModuleType, ModuleType]) -> None:
    """An HTTP flood and an endless chunked body against a local server end by `until` (+ a
    little), having sent something and counted what they saw."""
    _, att = bench

    async def server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if b"chunked" not in head:  # a flood request: answer 401 and close
            writer.write(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            writer.close()
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        while await reader.read(65536):  # the body: read for as long as it lasts
            pass
        writer.close()

    srv = await asyncio.start_server(server, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    target = att.Target([port], port, "nats://127.0.0.1:1", "r", "a")
    try:
        for name in ("unauth_flood", "chunked_get"):
            start = time.time()
            doc = await att.attack(name, target, start, start + 0.5)
            assert doc["ended"] - start < 3.0, doc
            assert doc["requests"] > 0, doc
        assert doc["statuses"].get("200") == 1, doc
        assert doc[f"bytes_sent_port_{port}"] > 0, doc
    finally:
        srv.close()
        await srv.wait_closed()


@pytest.mark.slow
def test_smoke_run_of_every_vector(tmp_path: Path) -> None:
    """One run with one-second phases: every vector's attacker ran and answered, every task
    was accounted for, none early, lost or doubled."""
    out = tmp_path / "edge.json"
    args = [sys.executable, str(BENCH / "edge_attacks.py"), "--pending", "1000"]
    args += ["--quiet-seconds", "2", "--phase-seconds", "1", "--gap-seconds", "1"]
    # The load runs --spare-seconds past the planned phases for the recoveries between them;
    # a vector with no load left is skipped. 45 s covers all 8 recoveries at their longest
    # (--max-recovery 5 s each): a busy host ran out of 30 s after 6 vectors.
    args += ["--max-recovery", "5", "--spare-seconds", "45", "--lead", "3", "--grace", "40"]
    args += ["--out", str(out)]
    done = subprocess.run(args, capture_output=True, timeout=240, env=dict(os.environ))
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    doc = json.loads(out.read_text())
    phases, order = doc["results"]["phases"], doc["results"]["order"]
    vectors = [n for n in order if n != "quiet" and not n.startswith("after_")]
    assert len(vectors) == 8, doc["results"]["setup"]["vectors_skipped"]
    for name in vectors:
        attacker = phases[name]["attacker"]
        assert "error" not in attacker and attacker["requests"] > 0, (name, attacker)
        assert attacker["statuses"], (name, attacker)
    judged = doc["results"]["setup"]["tasks_judged"]
    assert sum(p["expected"] for p in phases.values()) == judged >= 300 * (2 + 8 * 2)
    for name, p in phases.items():
        assert (p["lost"], p["doubled"], p["early"]) == (0, 0, 0), (name, p)
    assert b"| chunked_get |" in done.stderr
