"""`scheduler run --engines N`: N engine processes beside the edge, all stopped on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from tests.support.processes import cli_env, scheduler

READ = "read-token-for-the-crew"


def get(url: str, token: str | None = None) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=2) as resp:
        body = resp.read()
    return json.loads(body) if resp.headers.get_content_type() == "application/json" else body


def roles(pid: int) -> list[str]:
    """The `--role` of each running child of `pid` (psutil: the processes as the OS has them)."""
    found = []
    for child in psutil.Process(pid).children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            words = child.cmdline()
        except psutil.NoSuchProcess:
            continue
        found.append(words[words.index("--role") + 1] if "--role" in words else "?")
    return sorted(found)


async def test_run_starts_n_engines_beside_the_edge_and_sigterm_stops_every_one(
    tmp_path: Path, nats_url: str, database_url: str
) -> None:
    """`run --engines 3` under P = 1: two engine children and the edge child beside the engine
    in the process; three instances beat (one leader, two standbys), the edge serves the
    children's metrics as roles engine-2 and engine-3; SIGTERM stops every child before the
    process itself exits 0."""
    env = cli_env(
        tmp_path,
        SCHEDULER_NATS_URL=nats_url,
        SCHEDULER_DATABASE_URL=database_url,
        SCHEDULER_INSTANCE_ID="crew",
        SCHEDULER_READ_TOKEN=READ,
        SCHEDULER_LEASE_TTL="3",
        SCHEDULER_METRICS_EXPORT_INTERVAL="0.2s",
    )
    with scheduler(["run", "--engines", "3"], env) as proc:
        banner = await asyncio.to_thread(proc.wait_for, r"^  API ", 60, "out")
        api = banner.split()[1]
        metrics = (await asyncio.to_thread(proc.wait_for, r"^  metrics ", 1, "out")).split()[1]
        assert "  engines     3: this process and 2 beside it" in proc.out
        assert roles(proc.pid) == ["edge", "engine", "engine"]
        children = psutil.Process(proc.pid).children(recursive=True)
        async with asyncio.timeout(20):
            while True:
                items = (await asyncio.to_thread(get, api + "/v1/instances", READ))["items"]
                live = {i["instance"]: i["role"] for i in items if not i["stale"]}
                exposition = await asyncio.to_thread(get, metrics)
                shown = set(re.findall(rb'role="(engine[-0-9]*)"', exposition))
                if len(live) == 3 and shown == {b"engine", b"engine-2", b"engine-3"}:
                    break
                await asyncio.sleep(0.2)
        assert set(live) == {"crew", "crew-2", "crew-3"}
        assert sorted(live.values()) == ["leader", "standby", "standby"]
        proc.signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.proc.wait, 30)
        # gone before their parent exited: stopped by it, not by the kernel's parent-death signal
        running = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        await asyncio.to_thread(proc.wait_exit, 5)
    assert code == 0, proc.transcript()
    assert running == [], proc.transcript()
    stopped = [line for line in proc.err if "daemon.stopped role=engine" in line]
    assert len(stopped) == 3, proc.transcript()
