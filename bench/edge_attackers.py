"""The attackers of edge_attacks.py: one function per vector of issue 35, each bounded.

Each attacker runs in a child process of its own (`edge_attacks.py --attack NAME`), from its
`start` wall time until `until`, against 127.0.0.1 only, and never sends more than its bound of
requests (or bytes). It returns what it saw: answers by status (HTTP) or by reply (NATS), the
number of requests, their rate, and the child's own CPU seconds.

Vectors (names as in the report):
- `chunked_get`: one connection per instance sends `GET /healthz` with a chunked body of
  1-byte chunks, for as long as the phase lasts (issue 35 item 1);
- `metrics_scrape`: 24 concurrent scrapers of the leader's `/metrics` (item 2);
- `retry_after_ignored`: 24 read-token clients listing `status=pending&limit=500` that never
  wait on a 503's `Retry-After` (item 3);
- `empty_filters`: 24 read-token clients of `limit=1` listings whose filters match nothing,
  honouring `Retry-After` (item 3);
- `unauth_flood`: 24 clients without a token (401s) (item 3);
- `slow_admin_bodies`: 10 admin `POST /v1/delayed` trickling their bodies (one byte every
  0.5 s, never finished; they disconnect mid-body at the end), while a probe reads
  `/v1/stats` and `/v1/delayed?limit=1` every 0.25 s (item 4);
- `cancel_flood`: cancels over NATS on distinct targets (`scheduler.v1.cancel.bench.flood<n>`)
  with ids of 2,000 characters, 64 in flight (item 5);
- `nats_request_flood`: `scheduler.v1.get.bench.x` (an unknown id) and `scheduler.v1.stats`
  requests, 64 in flight.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import nats

HOST = "127.0.0.1"  # every attacker targets this host only
LIST = "/v1/delayed?status=pending&limit=500"
EMPTY = (
    "/v1/delayed?limit=1&subject=mq.zzz.>",
    "/v1/delayed?limit=1&org_id=nope",
    "/v1/delayed?limit=1&due_before=2000-01-01T00:00:00Z",
)
SLOW_BODY_BYTES = 4000  # announced Content-Length: never finished within a phase
MAX_REQUESTS = 1_000_000  # per attacker, whatever the phase's length
MAX_BYTES = 512 << 20  # per raw connection
MAX_RECONNECTS = 2000  # per raw connection


@dataclass
class Target:
    """Where the attack goes (all on 127.0.0.1) and the credentials it may use."""

    http_ports: list[int]  # the leader's first
    metrics_port: int
    nats_url: str
    read_token: str
    admin_token: str


@dataclass
class Tally:
    """What an attacker saw: answers by kind, requests sent, latency of those answered."""

    statuses: Counter[str] = field(default_factory=Counter)
    requests: int = 0
    ms: list[float] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    def room(self) -> bool:
        return self.requests < MAX_REQUESTS

    def answer(self, kind: str, started: float) -> None:
        self.statuses[kind] += 1
        self.ms.append((time.perf_counter() - started) * 1000)


# -- HTTP floods ---------------------------------------------------------------------------------


async def http_loop(
    http: aiohttp.ClientSession,
    url: str,
    paths: tuple[str, ...],
    headers: dict[str, str],
    until: float,
    tally: Tally,
    honour_retry: bool,
    label: str = "",
) -> None:
    """GET `paths` in turn until `until`; on a 503 wait its Retry-After only if `honour_retry`."""
    i = 0
    while time.time() < until and tally.room():
        path = paths[i % len(paths)]
        i += 1
        tally.requests += 1
        started = time.perf_counter()
        try:
            async with http.get(url + path, headers=headers, timeout=_left(until)) as resp:
                await resp.read()
                status, retry = resp.status, resp.headers.get("Retry-After")
        except (aiohttp.ClientError, TimeoutError) as exc:
            tally.statuses[f"{label}{type(exc).__name__}"] += 1
            await asyncio.sleep(0.05)
            continue
        tally.answer(f"{label}{status}", started)
        if status == 503 and honour_retry:
            await asyncio.sleep(min(float(retry or 1), max(0.0, until - time.time())))


async def http_crowd(
    url: str,
    clients: int,
    paths: tuple[str, ...],
    headers: dict[str, str],
    until: float,
    honour_retry: bool,
) -> Tally:
    tally = Tally()
    timeout = aiohttp.ClientTimeout(total=10)
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        loops = [
            http_loop(http, url, paths, headers, until, tally, honour_retry) for _ in range(clients)
        ]
        await asyncio.gather(*loops)
    return tally


def _left(until: float) -> aiohttp.ClientTimeout:
    """A request's timeout: at most 10 s, and over 2 s after the phase's end (the attacker must
    have stopped by the quiet that follows)."""
    return aiohttp.ClientTimeout(total=max(0.5, min(10.0, until + 2 - time.time())))


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def metrics_scrape(t: Target, until: float) -> Tally:
    url = f"http://{HOST}:{t.metrics_port}"
    return await http_crowd(url, 24, ("/metrics",), {}, until, honour_retry=False)


async def retry_after_ignored(t: Target, until: float) -> Tally:
    url = f"http://{HOST}:{t.http_ports[0]}"
    return await http_crowd(url, 24, (LIST,), _bearer(t.read_token), until, honour_retry=False)


async def empty_filters(t: Target, until: float) -> Tally:
    url = f"http://{HOST}:{t.http_ports[0]}"
    return await http_crowd(url, 24, EMPTY, _bearer(t.read_token), until, honour_retry=True)


async def unauth_flood(t: Target, until: float) -> Tally:
    url = f"http://{HOST}:{t.http_ports[0]}"
    return await http_crowd(url, 24, ("/v1/delayed?limit=1",), {}, until, honour_retry=False)


# -- raw connections: an endless chunked body, trickled admin bodies -----------------------------


async def _read_answers(reader: asyncio.StreamReader, tally: Tally, label: str) -> None:
    """Count every HTTP status line the server sends on this connection until it closes it."""
    buf = b""
    while True:
        chunk = await reader.read(65536)
        if not chunk:
            tally.statuses[f"{label}closed by server"] += 1
            return
        buf = (buf + chunk)[-65536:]
        while (at := buf.find(b"HTTP/1.1 ")) >= 0 and len(buf) >= at + 12:
            tally.statuses[f"{label}{buf[at + 9 : at + 12].decode(errors='replace')}"] += 1
            buf = buf[at + 12 :]


async def raw_connection(
    port: int,
    head: bytes,
    feed: Callable[[asyncio.StreamWriter], Awaitable[int]],
    until: float,
    tally: Tally,
    label: str = "",
) -> None:
    """Open a connection, send `head`, then `feed` it until `until` (or the server closes);
    reconnect (bounded) when the server closes; close it mid-body at the end."""
    sent = reconnects = 0
    while time.time() < until and reconnects < MAX_RECONNECTS and sent < MAX_BYTES:
        try:
            reader, writer = await asyncio.open_connection(HOST, port)
        except OSError as exc:
            tally.statuses[f"{label}{type(exc).__name__}"] += 1
            reconnects += 1
            await asyncio.sleep(0.1)
            continue
        tally.requests += 1
        answers = asyncio.create_task(_read_answers(reader, tally, label))
        try:
            writer.write(head)
            while time.time() < until and not answers.done() and sent < MAX_BYTES:
                sent += await asyncio.wait_for(feed(writer), max(0.05, until - time.time()))
        except TimeoutError:  # the phase ended while the server was not reading
            await asyncio.sleep(0)  # (an answer that came with the timeout is counted first)
            if not answers.done():
                tally.statuses[f"{label}unanswered at the phase's end"] += 1
        except (ConnectionError, OSError):
            tally.statuses[f"{label}reset while sending"] += 1
        finally:
            writer.close()
            answers.cancel()
            await asyncio.gather(answers, return_exceptions=True)
        reconnects += 1
    tally.notes[f"{label}bytes_sent_port_{port}"] = sent
    tally.notes[f"{label}connections_port_{port}"] = reconnects


def _chunks(count: int) -> Callable[[asyncio.StreamWriter], Awaitable[int]]:
    block = b"1\r\nx\r\n" * count

    async def feed(writer: asyncio.StreamWriter) -> int:
        writer.write(block)
        await writer.drain()  # as fast as the server reads, never faster
        return len(block)

    return feed


async def chunked_get(t: Target, until: float) -> Tally:
    """One endless chunked `GET /healthz` per instance, 64 one-byte chunks per write."""
    tally = Tally()
    head = f"GET /healthz HTTP/1.1\r\nHost: {HOST}\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    await asyncio.gather(
        *(raw_connection(p, head, _chunks(64), until, tally) for p in t.http_ports)
    )
    return tally


def _trickle(pause: float) -> Callable[[asyncio.StreamWriter], Awaitable[int]]:
    async def feed(writer: asyncio.StreamWriter) -> int:
        writer.write(b" ")  # JSON whitespace: a body that would still parse
        await writer.drain()
        await asyncio.sleep(pause)
        return 1

    return feed


async def _probe(url: str, token: str, until: float, tally: Tally) -> None:
    """Reads an operator makes meanwhile: `/v1/stats` and `/v1/delayed?limit=1` every 0.25 s."""
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        while time.time() < until and tally.room():
            for path in ("/v1/stats", "/v1/delayed?limit=1"):
                started = time.perf_counter()
                try:
                    async with http.get(
                        url + path, headers=_bearer(token), timeout=_left(until)
                    ) as resp:
                        await resp.read()
                        tally.answer(f"probe read {resp.status}", started)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    tally.statuses[f"probe read {type(exc).__name__}"] += 1
            await asyncio.sleep(0.25)


async def slow_admin_bodies(t: Target, until: float) -> Tally:
    """Ten admin writes trickling their bodies, and a probe checking that reads still answer."""
    tally = Tally()
    port = t.http_ports[0]
    head = (
        f"POST /v1/delayed HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: Bearer {t.admin_token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {SLOW_BODY_BYTES}\r\n\r\n"
    ).encode()
    writers = [raw_connection(port, head, _trickle(0.5), until, tally, "write ") for _ in range(10)]
    await asyncio.gather(*writers, _probe(f"http://{HOST}:{port}", t.read_token, until, tally))
    return tally


# -- NATS request floods ------------------------------------------------------------------------


def _reply_kind(data: bytes, headers: dict[str, str] | None) -> str:
    """`status` or `error.code` of a verb's JSON reply (`service error` for a micro error)."""
    if headers and headers.get("Nats-Service-Error-Code"):
        return f"service error {headers['Nats-Service-Error-Code']}"
    try:
        doc = json.loads(data)
    except ValueError:
        return "not json"
    if not isinstance(doc, dict):
        return "not an object"
    if isinstance(doc.get("error"), dict):
        return f"error {doc['error'].get('code')}"
    return str(doc.get("status", "answered"))


async def nats_flood(
    url: str, request: Callable[[int], tuple[str, bytes]], until: float, inflight: int, bound: int
) -> Tally:
    """`inflight` workers sending `request(n)` one after another until `until` or `bound`."""
    tally = Tally()
    nc = await nats.connect(url, max_reconnect_attempts=2)
    counter = iter(range(bound))

    async def worker() -> None:
        while time.time() < until and (n := next(counter, None)) is not None:
            subject, body = request(n)
            tally.requests += 1
            started = time.perf_counter()
            try:
                msg = await nc.request(subject, body, timeout=_left(until).total or 5.0)
            except nats.errors.NoRespondersError:
                tally.statuses["no responders"] += 1
                await asyncio.sleep(0.05)
                continue
            except (nats.errors.TimeoutError, TimeoutError):
                tally.statuses["timeout"] += 1
                continue
            tally.answer(_reply_kind(msg.data, msg.headers), started)

    try:
        await asyncio.gather(*(worker() for _ in range(inflight)))
    finally:
        await nc.close()
    return tally


def _cancel(id_chars: int, tag: str) -> Callable[[int], tuple[str, bytes]]:
    def request(n: int) -> tuple[str, bytes]:
        task_id = f"{tag}-{n}-".ljust(id_chars, "x")
        return f"scheduler.v1.cancel.bench.flood{n}", json.dumps({"id": task_id}).encode()

    return request


async def cancel_flood(t: Target, until: float) -> Tally:
    tag = os.urandom(4).hex()
    return await nats_flood(t.nats_url, _cancel(2000, tag), until, 64, 20_000)


def _get_or_stats(n: int) -> tuple[str, bytes]:
    if n % 2:
        return "scheduler.v1.stats", b""
    return "scheduler.v1.get.bench.x", json.dumps({"id": f"nope-{n}"}).encode()


async def nats_request_flood(t: Target, until: float) -> Tally:
    return await nats_flood(t.nats_url, _get_or_stats, until, 64, MAX_REQUESTS)


ATTACKS: dict[str, Callable[[Target, float], Awaitable[Tally]]] = {
    "chunked_get": chunked_get,
    "metrics_scrape": metrics_scrape,
    "retry_after_ignored": retry_after_ignored,
    "empty_filters": empty_filters,
    "unauth_flood": unauth_flood,
    "slow_admin_bodies": slow_admin_bodies,
    "cancel_flood": cancel_flood,
    "nats_request_flood": nats_request_flood,
}


async def attack(name: str, target: Target, start: float, until: float) -> dict[str, Any]:
    """Run attacker `name` from `start` to `until` (wall times); what it saw, as JSON."""
    await asyncio.sleep(max(0.0, start - time.time()))
    began, cpu0 = time.time(), _own_cpu()
    tally = await asyncio.wait_for(ATTACKS[name](target, until), until - began + 15)
    ended = time.time()
    ms = sorted(tally.ms)
    return {
        "attack": name,
        "started": began,
        "ended": ended,
        "requests": tally.requests,
        "per_second": round(tally.requests / max(ended - began, 1e-9), 1),
        "statuses": dict(tally.statuses),
        "answer_ms": {"count": len(ms), "p50": _q(ms, 0.5), "p99": _q(ms, 0.99)} if ms else {},
        "cpu_seconds": round(_own_cpu() - cpu0, 2),
    } | tally.notes


def _q(values: list[float], p: float) -> float:
    return round(values[min(len(values) - 1, int(p * len(values)))], 1)


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system
