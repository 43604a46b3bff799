"""Soak: a steady delayed-task load with hostile messages mixed in, through a nats-server restart
and a leader SIGKILL, on two daemons (lease TTL `--ttl`, 3 s).

A raw-socket producer publishes `--rate` tasks/s (2,000) for `--duration` s (180) to the delay
lane, each due `--delay` s (2) after its publish instant, and mixes `--hostile` (1 %) hostile
messages in (the kinds of issue 13: bytes that are not UTF-8 or not JSON, an invalid envelope,
numbers out of range, values PostgreSQL refuses, an id with a trailing newline, a refused
target, a message over the size limit, a subject that is not UTF-8, an id reused for another
target). At a third of the run nats-server is stopped for `--outage` s (2) and restarted on the
same port and store; at two thirds the leader is SIGKILLed and a fresh daemon joins the
survivor. The producer reconnects after the restart; a message whose PubAck never came (sent
just before the restart) is *unknown*: neither expected nor counted as lost.

Afterwards the target stream (BENCH, `mq.bench.>`, 2 min duplicate window) and the dead-letter
stream (MQ_DLQ) are read back. Checks: every acknowledged good task delivered once (lost 0,
doubled 0), none stored before its due time (early 0), and every acknowledged hostile message
dead-lettered exactly once and never delivered. Hostile messages are told apart by their
`X-Soak` header (or, when the daemon could not forward headers, `Mq-Original-Id`). CPU seconds
of both daemons, nats-server, PostgreSQL and the bench itself are reported with the machine's
busy fraction.

`--hostile 0` runs the clean soak. Figures: bench/README.md, "Soak".

    .venv/bin/python bench/soak.py [--rate 2000] [--duration 180] [--delay 2] [--hostile 0.01]
        [--ttl 3] [--outage 2] [--kinds not_json,too_large,...] [--logs DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import aiohttp
import nats
from common import (
    Daemon,
    Env,
    add_target_stream,
    cpu_by_command,
    machine_busy_seconds,
    own_cpu_seconds,
    report,
    run,
)
from rawnats import RawProducer
from traffic import STOPPING, envelope, iso_ms, read_back, stats

from scheduler.daemon.embedded import NatsServer, Postgres

LANE = "mq.delay.bench.x"
MAX_PAYLOAD = 1024 * 1024


# -- hostile messages -----------------------------------------------------------------------------
def _doc(task_id: str, due: float, now: float, **extra: Any) -> dict[str, Any]:
    doc = {"schema": "hanzo.mq.v1", "id": task_id, "type": "bench.hostile", "source": "soak"}
    doc |= {"timestamp": iso_ms(now), "priority": 5, "delay_until": iso_ms(due), "data": {}}
    return doc | extra


def _json(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


def hostile_message(kind: str, h: str, due: float, now: float) -> tuple[bytes, bytes, dict]:
    """(subject, payload, extra headers) of hostile message `h` of `kind`."""
    lane, doc = LANE.encode(), _doc(h, due, now)
    body = _json(doc)
    if kind == "not_utf8":
        return lane, b"\xff\xfe{", {}
    if kind == "not_json":
        return lane, b"not json at all", {}
    if kind == "invalid_envelope":
        return lane, _json(doc | {"priority": 0}), {}
    if kind == "ttl_overflow":
        return lane, _json(doc | {"ttl_seconds": 3e11}), {}
    if kind == "year_one":
        return lane, _json(doc | {"delay_until": "0001-01-01T00:00:00+14:00"}), {}
    if kind == "nan_data":
        return lane, body.replace(b'"data": {}', b'"data": {"x": NaN}'), {}
    if kind == "lone_surrogate":
        return lane, body.replace(b'"data": {}', b'"data": {"x": "\\ud800"}'), {}
    if kind == "nul_header":
        return lane, body, {"X-Note": "a\x00b"}
    if kind == "id_newline":
        return lane, _json(doc | {"id": h + "\n"}), {}
    if kind == "target_refused":
        return b"mq.delay.dlq.bench", body, {}
    if kind == "too_large":  # the payload is built when sent (SoakProducer.frame)
        return lane, b"", {"X-Pad": "y" * 3000}
    if kind == "subject_not_utf8":
        return b"mq.delay.bench.\xff", body, {}
    raise ValueError(f"unknown hostile kind {kind!r}")


HOSTILE = ("not_utf8", "not_json", "invalid_envelope", "ttl_overflow", "year_one", "nan_data",
           "lone_surrogate", "nul_header", "id_newline", "target_refused", "too_large",
           "subject_not_utf8")  # fmt: skip
DUPLICATE_ID = "duplicate_id"  # reuses a good task's id for another target (built in `load`)
KINDS = (*HOSTILE, DUPLICATE_ID)


def load(rate: float, duration: float, delay: float, hostile: float, kinds: list[str]):  # type: ignore[no-untyped-def]
    """Items (at, subject, payload, headers) in publish order, and what each one is: a good
    task id, or (hostile id, kind). Subjects are bytes for hostile items (maybe not UTF-8)."""
    rng = random.Random(7)
    items: list[tuple[float, bytes, bytes, dict[str, str]]] = []
    what: list[tuple[str, str | None]] = []
    start = time.time() + 3.0
    good_ids: list[str] = []
    tag = uuid.uuid4().hex[:6]
    n = int(rate * duration)
    for i in range(n):
        at = start + i / rate
        if kinds and rng.random() < hostile:
            kind = kinds[len(what) % len(kinds)]
            hid = f"h-{tag}-{i}"
            if kind == DUPLICATE_ID and good_ids:
                body = envelope(good_ids[-1], at + delay, at)
                items.append((at, b"mq.delay.bench.other", body, {"X-Soak": hid}))
            elif kind == DUPLICATE_ID:
                continue
            else:
                subject, body, extra = hostile_message(kind, hid, at + delay, at)
                items.append((at, subject, body, {"Nats-Msg-Id": hid, "X-Soak": hid} | extra))
            what.append((hid, kind))
            continue
        task_id = f"g-{tag}-{i}"  # a good task
        good_ids.append(task_id)
        items.append(
            (at, LANE.encode(), envelope(task_id, at + delay, at), {"Nats-Msg-Id": task_id})
        )
        what.append((task_id, None))
    return items, what


# -- producer that survives a broker restart ------------------------------------------------------
class SoakProducer(RawProducer):
    """RawProducer that remembers which items were acknowledged and reconnects after a broker
    restart; items whose time came while disconnected are skipped (never sent)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.acked_ids: set[int] = set()
        self.failed_ids: set[int] = set()
        self.sent_ids: set[int] = set()
        self.skipped = 0
        self.planned: list[float] = []  # publish instant of each item

    def on_msg(self, subject: bytes, reply: bytes, hdr: bytes, payload: bytes, at: float) -> None:
        i = int(subject.rsplit(b".", 1)[1])
        if (hdr and b" 503" in hdr) or b'"error"' in payload:
            self.failed_ids.add(i)
        else:
            self.acked_ids.add(i)

    def frame(self, i: int, subject: bytes, payload: bytes, headers: dict[str, str]) -> bytes:
        if not payload:  # too_large: built when sent, not kept for the whole run; with its
            # headers just under the server's max_payload (over it the server would drop our
            # connection), over the daemon's limit (max_payload - 4 KiB for its own headers)
            pad = "x" * (MAX_PAYLOAD - 5000)
            payload = _json(_doc(headers["X-Soak"], 0, 0, data={"pad": pad}))
        block = "NATS/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        h = block.encode()
        reply = f"{self.inbox}.{i}".encode()
        head = b"HPUB %s %s %d %d\r\n" % (subject, reply, len(h), len(h) + len(payload))
        return head + h + payload + b"\r\n"

    async def run(self, items: list[tuple[float, bytes, bytes, dict[str, str]]]) -> None:
        self.planned = [it[0] for it in items]
        i, n = 0, len(items)
        while i < n:
            if STOPPING.is_set():
                raise asyncio.CancelledError
            if self.task is None or self.task.done():  # the broker went away: reconnect
                await self._reconnect()
                now = time.time()
                while i < n and items[i][0] < now - 0.5:  # their time passed while down
                    i, self.skipped = i + 1, self.skipped + 1
                continue
            now = time.time()
            j = i
            chunk = []
            while j < n and items[j][0] <= now:
                chunk.append(self.frame(j, items[j][1], items[j][2], items[j][3]))
                j += 1
            if chunk:
                try:
                    assert self.writer is not None
                    self.writer.write(b"".join(chunk))
                    await self.writer.drain()
                    self.sent_ids.update(range(i, j))
                except (ConnectionError, OSError, RuntimeError):
                    pass  # unknown: the read loop ends (or has ended) and we reconnect
                i = j
            if i < n:
                await asyncio.sleep(max(0.001, items[i][0] - time.time()))
        await asyncio.sleep(5.0)  # the last acks

    async def _reconnect(self) -> None:
        await self.close()
        self.task = None
        while not STOPPING.is_set():
            try:
                self._pong = asyncio.Event()
                await self.open(self.inbox + ".*")
                return
            except (ConnectionError, OSError, TimeoutError):
                await asyncio.sleep(0.2)


# -- the run --------------------------------------------------------------------------------------
class Fleet:
    def __init__(self, env: Env, ttl: float, logs: str) -> None:
        self.env, self.ttl, self.logs = env, ttl, logs
        self.daemons: list[Daemon] = []
        self.cpu_dead = 0.0  # CPU seconds of daemons already gone

    def start_one(self) -> Daemon:
        n = len(self.daemons) + 1
        d = Daemon(self.env, lease_ttl=str(self.ttl), instance_id=f"soak-{n}", log_level="INFO")
        self.daemons.append(d.start())
        return d

    def alive(self) -> list[Daemon]:
        return [d for d in self.daemons if d.proc is not None and d.proc.poll() is None]

    def cpu(self) -> float:
        return self.cpu_dead + sum(d.cpu_seconds() for d in self.alive())

    async def leader(self, http: aiohttp.ClientSession, within: float = 15) -> Daemon:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            for d in self.alive():
                try:
                    async with http.get(f"http://127.0.0.1:{d.http}/readyz") as r:
                        if (await r.json()).get("role") == "leader":
                            return d
                except (aiohttp.ClientError, ValueError):
                    pass
            await asyncio.sleep(0.02)
        raise RuntimeError(f"no leader within {within} s: {[d.log_tail() for d in self.alive()]}")

    def kill(self, d: Daemon) -> None:
        self.cpu_dead += d.cpu_seconds()
        assert d.proc is not None
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(10)

    def stop(self) -> None:
        for d in self.daemons:
            d.stop()
            if self.logs:
                os.makedirs(self.logs, exist_ok=True)
                shutil.copy(
                    d.log_path, os.path.join(self.logs, f"{d.env['SCHEDULER_INSTANCE_ID']}.log")
                )


async def soak(a: argparse.Namespace, ns: NatsServer, env: Env) -> dict[str, Any]:
    kinds = [k for k in (a.kinds.split(",") if a.kinds else KINDS) if k] if a.hostile else []
    items, what = load(a.rate, a.duration, a.delay, a.hostile, kinds)
    nc = await nats.connect(env.nats_url)
    await add_target_stream(nc.jetstream())
    await nc.close()
    fleet = Fleet(env, a.ttl, a.logs)
    events: dict[str, Any] = {}
    http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1))
    try:
        fleet.start_one()
        fleet.start_one()
        await fleet.leader(http)
        producer = SoakProducer(env.nats_url)
        await producer.start()
        cpu0 = snapshot(fleet)
        t0 = items[0][0]
        feeding = asyncio.create_task(producer.run(items))
        await asyncio.sleep(max(0.0, t0 + a.duration / 3 - time.time()))
        events["nats_restart_at_s"] = round(time.time() - t0, 1)
        await asyncio.to_thread(ns.stop)
        await asyncio.sleep(a.outage)
        await asyncio.to_thread(ns.start)
        await asyncio.sleep(max(0.0, t0 + 2 * a.duration / 3 - time.time()))
        victim = await fleet.leader(http)
        killed = time.time()
        events["leader_killed_at_s"] = round(killed - t0, 1)
        events["killed"] = victim.env["SCHEDULER_INSTANCE_ID"]
        fleet.kill(victim)
        survivor = await fleet.leader(http, within=3 * a.ttl + 5)
        events["takeover_s"] = round(time.time() - killed, 2)
        events["successor"] = survivor.env["SCHEDULER_INSTANCE_ID"]
        fleet.start_one()
        await feeding
        await asyncio.sleep(a.delay)  # the last ones fall due
        cpu1 = snapshot(fleet)
        await asyncio.sleep(a.grace)  # stragglers (retries after the outages) arrive
        await producer.close()
        target = await read_back(env.nats_url, "BENCH")
        dlq = await read_back(env.nats_url, "MQ_DLQ")
    finally:
        await http.close()
        fleet.stop()
    return judge(what, producer, target, dlq, a.delay) | {
        "events": events,
        "cores": cores(cpu0, cpu1, len(items)),
    }


def snapshot(fleet: Fleet) -> tuple[Any, ...]:
    """CPU seconds so far: daemons, nats-server and postgres, the bench; machine busy; now."""
    return fleet.cpu(), cpu_by_command(), own_cpu_seconds(), machine_busy_seconds(), time.time()


def cores(before: tuple[Any, ...], after: tuple[Any, ...], tasks: int) -> dict[str, Any]:
    wall = after[4] - before[4]
    cpu = {"daemons": after[0] - before[0], "bench": after[2] - before[2]}
    cpu |= {k: after[1][k] - before[1].get(k, 0.0) for k in after[1]}
    busy = after[3] - before[3]
    return {
        "wall_seconds": round(wall, 1),
        "cpu_seconds": {k: round(v, 1) for k, v in cpu.items()},
        "cpu_share_of_a_core": {k: round(v / wall, 3) for k, v in cpu.items()},
        "cpu_us_per_task": {k: round(v / max(tasks, 1) * 1e6, 1) for k, v in cpu.items()},
        "machine_busy_fraction": round(busy / wall / (os.cpu_count() or 1), 3),
    }


def judge(what: list[tuple[str, str | None]], producer: SoakProducer, target: list[Any],
          dlq: list[Any], delay: float) -> dict[str, Any]:  # fmt: skip
    """Classify every acknowledged item by what the two streams hold."""
    at = producer.planned
    stored: dict[str, list[float]] = defaultdict(list)
    for m in target:
        stored[(m.headers or {}).get("Nats-Msg-Id", "?")].append(m.metadata.timestamp.timestamp())
    dead: Counter[str] = Counter()
    reasons: dict[str, Counter[str]] = defaultdict(Counter)
    for m in dlq:
        h = m.headers or {}
        hid = h.get("X-Soak") or h.get("Mq-Original-Id", "")
        dead[hid] += 1
        reasons[hid][h.get("Mq-Error-Reason", "?")] += 1
    good = {"acked": 0, "unknown": 0, "delivered_once": 0, "lost": 0, "doubled": 0, "early": 0}
    late: list[float] = []
    hostile: dict[str, dict[str, Any]] = {}
    for i, (hid, kind) in enumerate(what):
        acked = i in producer.acked_ids
        if kind is None:
            due = int((at[i] + delay) * 1000) / 1000  # the envelope's delay_until, ms floored
            if not acked:
                good["unknown"] += 1
                continue
            good["acked"] += 1
            times = stored.get(hid, [])
            good["lost"] += not times
            good["doubled"] += len(times) > 1
            good["delivered_once"] += len(times) == 1
            if times:
                good["early"] += times[0] < due
                late.append((times[0] - due) * 1000)
            continue
        h = hostile.setdefault(kind, {"sent": 0, "acked": 0, "dead_lettered_once": 0,
                                      "dead_lettered_more": 0, "not_dead_lettered": 0,
                                      "delivered": 0, "reasons": Counter()})  # fmt: skip
        h["sent"] += i in producer.sent_ids
        if not acked:
            continue
        h["acked"] += 1
        n = dead.get(hid, 0)
        h["dead_lettered_once"] += n == 1
        h["dead_lettered_more"] += n > 1
        h["not_dead_lettered"] += n == 0
        h["delivered"] += hid in stored
        h["reasons"].update(reasons.get(hid, {}))
    for h in hostile.values():
        h["reasons"] = dict(h["reasons"])
    good |= {"store_lateness_ms": stats(late), "skipped_while_down": producer.skipped}
    return {"good": good, "hostile": hostile}


async def measure(a: argparse.Namespace) -> dict[str, Any]:
    workdir = tempfile.mkdtemp(prefix="mqs-soak-")
    ns = NatsServer(Path(workdir) / "nats")
    pg = Postgres(Path(workdir) / "pg")
    try:
        ns.start()
        pg.start()
        return await soak(a, ns, Env(ns.url, pg.url, workdir))
    finally:
        ns.stop()
        pg.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=2000)
    ap.add_argument("--duration", type=float, default=180)
    ap.add_argument("--delay", type=float, default=2)
    ap.add_argument("--hostile", type=float, default=0.01, help="share of hostile messages")
    ap.add_argument("--kinds", default="", help=f"comma-separated subset of {','.join(KINDS)}")
    ap.add_argument("--ttl", type=float, default=3)
    ap.add_argument("--outage", type=float, default=2)
    ap.add_argument("--grace", type=float, default=30, help="s to wait after the last due time")
    ap.add_argument("--logs", default="", help="keep the daemons' logs in this folder")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    a = ap.parse_args()
    r = run(measure(a))
    g, hostile = r["good"], r["hostile"]
    hostile_ok = all(
        h["dead_lettered_once"] == h["acked"] and h["delivered"] == 0 for h in hostile.values()
    )
    passed = bool(
        g["acked"] and g["lost"] == 0 and g["doubled"] == 0 and g["early"] == 0 and hostile_ok
    )
    bad = {k: h["acked"] - h["dead_lettered_once"] for k, h in hostile.items()}
    report(
        "soak",
        {k: v for k, v in vars(a).items() if k not in ("out", "logs")},
        r,
        {"lost": 0, "doubled": 0, "early": 0, "hostile": "each dead-lettered once, none delivered"},
        passed,
        f"good {g['delivered_once']}/{g['acked']} lost {g['lost']} doubled {g['doubled']} "
        f"early {g['early']} (unknown {g['unknown']}, p99 {g['store_lateness_ms'].get('p99')} "
        f"ms); hostile {sum(h['acked'] for h in hostile.values())} acked, not once in DLQ "
        f"{ {k: v for k, v in bad.items() if v} or 0 }; restart at "
        f"{r['events'].get('nats_restart_at_s')} s, kill at {r['events'].get('leader_killed_at_s')}"
        f" s, takeover {r['events'].get('takeover_s')} s",
        a.out,
    )


if __name__ == "__main__":
    main()
