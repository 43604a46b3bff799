"""The HTTP edge's bounds in time and cost (issue 35): bodies refused where no route takes one,
read whole under a deadline before a request is admitted, slow heads and trickled idle bytes
cut, and listings charged for the work they did. Refusals answered before routing run on the
twins (tests/unit/test_api_refusals.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

import asyncpg
import pytest
from starlette.types import Receive, Scope, Send

from scheduler.api import gate, lingering
from scheduler.api.deadlines import ConnectionLimits
from scheduler.api.server import serve
from tests.integration.api.harness import ADMIN, READ, ApiHarness, poll
from tests.integration.api.test_edge import _read_answer, head_of


@dataclass
class Trickled:
    """What a trickling client saw: the answer (None: none), and after how many seconds the
    server ended the connection (None: it was still open when the client gave up)."""

    status: int | None
    body: bytes
    ended: float | None


async def trickle(
    url: str, head: bytes, piece: bytes, every: float = 0.05, within: float = 6.0
) -> Trickled:
    """Send `head`, then `piece` every `every` s, until the server ends the connection or
    `within` s have passed."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    loop = asyncio.get_running_loop()
    began = loop.time()
    drained = asyncio.create_task(reader.read(-1))  # every byte until the server's end
    try:
        writer.write(head)
        while not drained.done() and loop.time() - began < within:
            try:
                writer.write(piece)
                await writer.drain()
            except ConnectionError:
                break  # the server is gone: what the reader saw says when
            await asyncio.wait({drained}, timeout=every)
        await asyncio.wait({drained}, timeout=1.0)
        ended = loop.time() - began if drained.done() else None
        got = b"" if not drained.done() or drained.exception() else drained.result()
    finally:
        drained.cancel()
        writer.close()
    status = int(got.split(b" ", 2)[1]) if got.startswith(b"HTTP/1.1 ") else None
    return Trickled(status, got.partition(b"\r\n\r\n")[2], ended)


# -- bodies where no route takes one -----------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/healthz", 400),
        ("DELETE", "/v1/delayed/x", 400),
        ("POST", "/openapi.json", 405),  # no route: the app's answer, the body unread
        ("TRACE", "/v1/nothing", 404),
    ],
)
async def test_a_body_where_no_route_takes_one_is_refused_before_it_is_read(
    api: ApiHarness, method: str, path: str, status: int
) -> None:
    """An endless chunked body in 1-byte chunks on a route that takes no body is answered
    400 `body_not_allowed` (where no route serves the request, its 405 or 404; on a method
    that takes no body, 1 s after the head, the connection held unread meanwhile), and the
    connection ends within the 2 s linger, instead of being read (and the keep-alive timer
    reset) for as long as the client sends."""
    await api.start()
    head = head_of(
        api, method, path, "Transfer-Encoding: chunked", f"Authorization: Bearer {ADMIN}"
    )
    got = await trickle(api.url, head.encode(), b"1\r\nx\r\n", every=0.02)
    assert got.status == status, got
    if status == 400:
        problem = json.loads(got.body)
        assert problem["code"] == "body_not_allowed" and method in problem["detail"], problem
    assert got.ended is not None and got.ended < 4.0, got


# -- bodies read before admission, under a deadline --------------------------------------------


def _slow_write(api: ApiHarness, length: int = 200, path: str = "/v1/delayed/x") -> bytes:
    """The head of an admin's write declaring `length` bytes of body, and its first bytes."""
    head = head_of(
        api,
        "PATCH" if path.startswith("/v1/delayed/") else "POST",
        path,
        "Content-Type: application/json",
        f"Content-Length: {length}",
        f"Authorization: Bearer {ADMIN}",
    )
    return head.encode() + b'{"delay_until": '


async def test_slow_admin_bodies_hold_no_admission_slot(
    api: ApiHarness, caplog: pytest.LogCaptureFixture
) -> None:
    """Ten admin `POST /v1/delayed` whose bodies are still arriving leave every admission
    slot free (a listing is served 200, not 503), and when their clients go away mid-body
    each leaves one `api.body_abandoned` line and no error, traceback or 500."""
    await api.start()
    url = urlsplit(api.url)
    writers = []
    for _ in range(10):
        _, writer = await asyncio.open_connection(url.hostname, url.port)
        writer.write(_slow_write(api, path="/v1/delayed?subject=mq.tasks.work"))
        await writer.drain()
        writers.append(writer)
    await asyncio.sleep(0.3)  # every request is in, its body half sent
    caplog.set_level(logging.INFO)
    try:
        for _ in range(3):
            r = await api.call("GET", "/v1/delayed", token=READ, params={"limit": 1})
            assert r.status == 200, r
    finally:
        for writer in writers:
            writer.close()

    async def abandoned() -> int:
        return len([r for r in caplog.records if "api.body_abandoned" in r.getMessage()])

    await poll(abandoned, lambda n: n >= 10, within=5)
    await asyncio.sleep(0.2)  # anything logged after the last of them
    assert await abandoned() == 10
    http = [r for r in caplog.records if r.name.startswith(("scheduler.api", "uvicorn"))]
    bad = [r for r in http if r.levelno >= logging.WARNING or r.exc_info]
    assert not bad, [r.getMessage() for r in bad]


async def test_a_body_must_arrive_within_its_deadline(api: ApiHarness) -> None:
    """With SCHEDULER_API_BODY_TIMEOUT=1s a write whose body trickles a byte every 50 ms is
    answered 408 `body_timeout` about a second after its head (the deadline is the body's
    whole, not per read), and the connection ends within the linger."""
    await api.start(api_body_timeout="1s")
    got = await trickle(api.url, _slow_write(api, 10_000), b" ", every=0.05)
    assert got.status == 408, got
    problem = json.loads(got.body)
    assert problem["code"] == "body_timeout"
    assert "SCHEDULER_API_BODY_TIMEOUT" in problem["detail"], problem
    assert got.ended is not None and 0.9 < got.ended < 4.5, got


# -- request heads and idle connections (the HTTP layer: uvicorn with our protocol) ------------


async def _ok(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def test_a_slow_head_is_cut_at_the_header_timeout() -> None:
    """A client sending a request's head a byte every 50 ms (slowloris), or a connection that
    sends nothing, gets 408 and a closed connection at the head's deadline (0.5 s here), while
    a prompt request on the same server is served."""
    served = await serve(_ok, "127.0.0.1", 0, ConnectionLimits(header_timeout=0.5))
    try:
        head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: "
        slow, silent = await asyncio.gather(
            trickle(served.url, head, b"a", every=0.05, within=4.0),
            trickle(served.url, b"", b"", every=0.05, within=4.0),
        )
        for got in (slow, silent):
            assert got.status == 408 and b"SCHEDULER_API_HEADER_TIMEOUT" in got.body, got
            assert got.ended is not None and 0.4 < got.ended < 1.5, got
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        try:
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            async with asyncio.timeout(2):
                status, headers, _ = await _read_answer(reader)
            assert status == 200 and headers.get("connection") != "close"
        finally:
            writer.close()
    finally:
        await served.close()


async def test_trickled_bytes_do_not_keep_an_idle_connection_open() -> None:
    """After an answer, a client that sends a byte every 100 ms and never a whole head is cut
    at the head's deadline (0.5 s after its first byte), not kept open as long as it trickles."""
    served = await serve(_ok, "127.0.0.1", 0, ConnectionLimits(0.5, idle_timeout=1))
    try:
        got = await trickle(served.url, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"G", every=0.1)
        assert got.status == 200, got
        assert got.ended is not None and got.ended < 2.0, got
    finally:
        await served.close()


async def _path(scope: Scope, receive: Receive, send: Send) -> None:
    body = scope["path"].encode()
    length = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": length})
    await send({"type": "http.response.body", "body": body})


async def _get(port: int, name: str) -> bytes:
    """One `GET /<name>` on a connection of its own: the body of its 200 answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET /{name} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        async with asyncio.timeout(5):
            status, _, body = await _read_answer(reader)
        assert status == 200
        return body
    finally:
        writer.close()


async def test_reads_past_the_pace_wait_their_turn_and_are_answered_in_order() -> None:
    """At a pace of 50 reads a second (a burst of 5), 40 clients each sending one request at
    once are all answered, but no faster than the pace: the last answer comes at least
    (40 - 5) / 50 = 0.7 s after the first request, where unpaced all 40 take a few tens of
    milliseconds. Three requests written at once on one connection (one read) come back in
    order."""
    served = await serve(_path, "127.0.0.1", 0, ConnectionLimits(reads_per_second=50))
    loop = asyncio.get_running_loop()

    try:
        began = loop.time()
        bodies = await asyncio.gather(*(_get(served.port, f"c{i}") for i in range(40)))
        took = loop.time() - began
        assert list(bodies) == [f"/c{i}".encode() for i in range(40)]
        assert took >= 0.65, took
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        try:
            heads = (f"GET /p/{i} HTTP/1.1\r\nHost: x\r\n\r\n" for i in range(3))
            writer.write("".join(heads).encode())
            async with asyncio.timeout(5):
                piped = [(await _read_answer(reader))[2] for _ in range(3)]
            assert piped == [b"/p/0", b"/p/1", b"/p/2"]
        finally:
            writer.close()
    finally:
        await served.close()


async def test_new_connections_past_their_pace_wait_their_turn_unread() -> None:
    """At a pace of 20 new connections a second (a second's worth at once), 40 clients each
    opening a connection for one request are all answered, the last no sooner than
    (40 - 20) / 20 = 1 s after the first (unpaced: tens of milliseconds; seen failing),
    however fast reads may go (their pace is 500 here)."""
    limits = ConnectionLimits(connections_per_second=20)
    served = await serve(_path, "127.0.0.1", 0, limits)
    loop = asyncio.get_running_loop()

    try:
        began = loop.time()
        bodies = await asyncio.gather(*(_get(served.port, f"n{i}") for i in range(40)))
        took = loop.time() - began
        assert sorted(bodies) == sorted(f"/n{i}".encode() for i in range(40))
        assert took >= 0.9, took
    finally:
        await served.close()


async def test_a_connection_past_the_open_bound_is_closed_unread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With at most 3 connections open (SCHEDULER_API_MAX_CONNECTIONS), 3 silent ones held
    open, a fourth is closed at once without an answer, and the refusal is logged; once one
    of the three has gone, a new connection is served."""
    served = await serve(_ok, "127.0.0.1", 0, ConnectionLimits(header_timeout=5, max_open=3))
    held = [await asyncio.open_connection("127.0.0.1", served.port) for _ in range(3)]
    try:
        await asyncio.sleep(0.1)  # the server has accepted them
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        try:
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            async with asyncio.timeout(2):
                try:
                    got = await reader.read(-1)
                except ConnectionResetError:
                    got = b""
            assert got == b"", got  # no answer: the connection was closed unread
        finally:
            writer.close()
        assert "api.connections_full open=3" in caplog.text
        held.pop()[1].close()
        async with asyncio.timeout(5):
            while True:  # the server sees the close
                reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
                try:
                    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                    try:
                        status, _, _ = await _read_answer(reader)
                    except (asyncio.IncompleteReadError, ConnectionResetError):
                        await asyncio.sleep(0.05)
                        continue
                    assert status == 200
                    break
                finally:
                    writer.close()
    finally:
        for _, w in held:
            w.close()
        await served.close()


async def _reads_the_body(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers how many body bytes it could read within 0.5 s (none: 204)."""
    got = b""
    try:
        async with asyncio.timeout(0.5):
            while True:
                message = await receive()
                got += message.get("body", b"")
                if not message.get("more_body"):
                    break
    except TimeoutError:
        pass
    status = 200 if got else 204
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": str(len(got)).encode()})


async def test_the_body_of_a_get_is_dropped_unparsed() -> None:
    """A GET followed by a chunked body of 2,000 one-byte chunks in the same write: none of it
    reaches the parser or the application (204 from an app that answers what body it could
    read; unparsed, it read 2,000 bytes: seen failing), while a POST's body still does."""
    served = await serve(_reads_the_body, "127.0.0.1", 0, ConnectionLimits())
    chunks = b"1\r\nx\r\n" * 2000

    async def sent(method: str) -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
        try:
            writer.write(
                f"{method} / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
                + chunks
                + (b"0\r\n\r\n" if method == "POST" else b"")
            )
            async with asyncio.timeout(5):
                head = await reader.readuntil(b"\r\n\r\n")
            return int(head.split()[1])
        finally:
            writer.close()

    try:
        assert await sent("GET") == 204
        assert await sent("POST") == 200
    finally:
        await served.close()


async def test_an_endless_body_of_a_get_is_held_unread_then_answered_and_reset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client writing a GET's chunked body without end: nothing more of the body is read, so
    its writes stall once the sockets' buffers are full (a few megabytes at most, where a
    reader on loopback takes hundreds a second); its answer comes HELD_ANSWER_WAIT after the
    head, and the reset LINGER_SECONDS after it. Before, the server read and dropped 64 KiB,
    answered at once and cut the connection within milliseconds (seen failing)."""
    monkeypatch.setattr(lingering, "HELD_ANSWER_WAIT", 0.5)
    monkeypatch.setattr(lingering, "LINGER_SECONDS", 1.0)
    served = await serve(_ok, "127.0.0.1", 0, ConnectionLimits())
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    loop = asyncio.get_running_loop()
    answer = bytearray()
    answered: list[float] = []

    async def read_answer() -> None:  # as a client does, while it sends
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(4096):
                answered.append(loop.time() - began)
                answer.extend(chunk)

    began = loop.time()
    answers = asyncio.create_task(read_answer())
    sent = 0
    ended: float | None = None
    try:
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        block = b"1\r\nx\r\n" * 1024
        with contextlib.suppress(ConnectionError, TimeoutError):
            async with asyncio.timeout(5):
                while True:
                    writer.write(block)
                    await writer.drain()
                    sent += len(block)
        ended = loop.time() - began
        await asyncio.wait_for(answers, 1)
    finally:
        answers.cancel()
        writer.close()
        await served.close()
    assert bytes(answer).startswith(b"HTTP/1.1 200"), bytes(answer)
    assert answered and 0.45 <= answered[0] < 0.9, answered
    assert ended is not None and 0.9 <= ended < 3.0, ended
    assert sent < 16 << 20, sent


async def test_a_client_back_for_a_new_connection_after_each_refused_body_waits_for_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client that sends a GET with an endless chunked body and, once answered, comes
    straight back on a new connection (bench/edge_attackers.py's `chunked_get`) gets one
    answer per HELD_ANSWER_WAIT: 3 or 4 in 1.2 s at 0.3 s. Answered at once, it got 210
    connections a second through the edge's pace (here, no pace: hundreds; seen failing)."""
    monkeypatch.setattr(lingering, "HELD_ANSWER_WAIT", 0.3)
    served = await serve(_ok, "127.0.0.1", 0, ConnectionLimits(connections_per_second=0))
    loop = asyncio.get_running_loop()
    until = loop.time() + 1.2
    answers = 0
    try:
        while loop.time() < until:
            reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
            try:
                writer.write(
                    b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                    + b"1\r\nx\r\n" * 64
                )
                async with asyncio.timeout(max(0.01, until - loop.time())):
                    await reader.readuntil(b"\r\n\r\n")
                answers += 1
            except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()
    finally:
        await served.close()
    assert 1 <= answers <= 4, answers


# -- refusals before routing, and listings charged by work -------------------------------------


EMPTY_FILTERS = (
    {"subject": "mq.zzz.>"},
    {"org_id": "nope"},
    {"due_before": "2000-01-01T00:00:00Z"},
)


async def test_a_listing_that_matches_nothing_is_charged_for_its_work(
    api: ApiHarness, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`limit=1` listings whose filters match nothing among 100,000 pending tasks are charged
    the rows their time was worth, not one row each: sent back to back against a budget of
    200 rows/s (one 500-row page in the bucket), several are refused 503 `overloaded` with
    Retry-After, as full pages would be (charged one row each, none ever was)."""
    # Work priced at 10x the daemon's rate: what is under test is that a listing pays for its
    # time at all; at the real rate a fast idle host (5-10 ms a scan) stayed under the bucket.
    monkeypatch.setattr(gate, "WORK_ROWS_PER_SECOND", 10 * gate.WORK_ROWS_PER_SECOND)
    await api.start(api_read_rows_per_second=200)
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "INSERT INTO delayed_messages (id, target, payload, due_at, scheduled_for) "
            "SELECT 'far' || i, 'mq.tasks.s' || (i % 7), '{}'::bytea, "
            "now() + interval '1 day' + i * interval '1 second', now() "
            "FROM generate_series(1, 100000) AS i"
        )
        await conn.execute("ANALYZE delayed_messages")
    finally:
        await conn.close()
    refused = []
    for i in range(18):
        params = {**EMPTY_FILTERS[i % 3], "limit": 1}
        r = await api.call("GET", "/v1/delayed", token=READ, params=params)
        assert r.status in (200, 503), r
        if r.status == 503:
            assert r.body["code"] == "overloaded" and int(r.headers["Retry-After"]) >= 1, r
            refused.append(r)
    assert len(refused) >= 3, len(refused)


async def test_a_listing_is_charged_its_queries_time_not_its_wait_for_a_connection(
    api: ApiHarness,
) -> None:
    """A listing that waited 0.6 s for the API pool's one connection (held here) ran a query
    of a few milliseconds: it is charged that, so a full page right after it is served. Charged
    the route's whole time (48,000 rows' worth at WORK_ROWS_PER_SECOND), the page after it was
    refused 503 for seconds: in CI a console page's concurrent reads on a loaded host were
    charged their overlap several times over, and the next page showed "Cannot show this"."""
    daemon = await api.start(api_pool_size=1)
    held = await daemon.api_store.pool.acquire()
    try:
        listing = asyncio.create_task(
            api.call("GET", "/v1/delayed", token=READ, params={"limit": 1})
        )
        await asyncio.sleep(0.6)
        assert not listing.done()  # it waits for the pool's one connection
    finally:
        await daemon.api_store.pool.release(held)
    assert (await listing).status == 200
    page = await api.call("GET", "/v1/delayed", token=READ, params={"limit": 500})
    assert page.status == 200, page
