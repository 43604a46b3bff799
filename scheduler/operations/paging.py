"""Opaque list cursors: the last row's sort key, tagged with the list it belongs to.

A cursor is URL-safe base64 of an HMAC-SHA256 tag (16 bytes) and a small JSON array; callers
pass `next_cursor` back unchanged. A cursor of another list, one that was edited (its tag no
longer matches), or one whose parts are out of range (checked even when signed: the key could
leak, and the database must never see a priority of 40000 or a NUL) is refused 400
`bad_cursor` with a message naming `cursor` and the problem.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

from nats.js.errors import KeyWrongLastSequenceError, NoStreamResponseError
from nats.js.kv import KeyValue

from scheduler.errors import RequestError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a list and the cursor of the next (None on the last page)."""

    items: list[T]
    next_cursor: str | None


# The signing key: one per deployment (`load_key` reads it from the state bucket at start),
# until then one per process, so a cursor is never unsigned.
_KEY = [secrets.token_bytes(32)]
KEY_NAME = "api.cursor_key"  # in SCHEDULER_STATE_BUCKET
MAC_BYTES = 16


def use_key(key: bytes) -> None:
    """Sign and check cursors with `key` from now on (every instance of a deployment holds the
    same one, so any instance continues a list another one started)."""
    _KEY[0] = key


LEADERLESS_RETRIES, LEADERLESS_WAIT = 75, 0.2  # 15 s: a bucket's first election, with margin


async def load_key(kv: KeyValue) -> bytes:
    """The deployment's cursor key from the state bucket, created there (random, 32 bytes) by
    the first instance to ask; installed with `use_key`.

    Why there: every instance reads the bucket (it shares NATS as it shares PostgreSQL) and
    nobody else may (docs/security.md grants `$KV.scheduler_state.>` to the daemon only), so
    it is shared without a setting to distribute, and a producer cannot forge a cursor. A key
    that vanishes (bucket recreated) only costs open clients a `bad_cursor` and a restart of
    their listing. Creation races are settled by KV `create` (one wins, the rest read it)."""
    fresh = base64.b64encode(secrets.token_bytes(32))
    for attempt in range(LEADERLESS_RETRIES):
        try:
            await kv.create(KEY_NAME, fresh)
            key = fresh
            break
        except KeyWrongLastSequenceError:
            entry = await kv.get(KEY_NAME)
            key = entry.value or b""
            break
        except (NoStreamResponseError, TimeoutError):
            # a replicated bucket just created has no leader for a few seconds (its election)
            if attempt == LEADERLESS_RETRIES - 1:
                raise
            await asyncio.sleep(LEADERLESS_WAIT)
    raw = base64.b64decode(key)
    if len(raw) < 16:
        raise ValueError(f"{KEY_NAME} in the state bucket is not a key; delete it and restart")
    use_key(raw)
    return raw


def encode(kind: str, key: Sequence[Any]) -> str:
    body = json.dumps([kind, *key], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(_mac(body) + body).decode().rstrip("=")


def _mac(body: bytes) -> bytes:
    return hmac.new(_KEY[0], body, hashlib.sha256).digest()[:MAC_BYTES]


@dataclass(frozen=True, slots=True)
class Int:
    """An integer key part and its range."""

    name: str
    low: int
    high: int

    def problem(self, value: Any) -> str | None:
        if type(value) is not int:
            return f"{self.name} is not an integer"
        if not self.low <= value <= self.high:
            return f"{self.name} {value} is out of range {self.low}..{self.high}"
        return None


@dataclass(frozen=True, slots=True)
class Text:
    """A text key part: printable, no NUL or control character, at most `longest` long."""

    name: str
    longest: int = 200

    def problem(self, value: Any) -> str | None:
        if type(value) is not str:
            return f"{self.name} is not a string"
        if not 0 < len(value) <= self.longest or not value.isprintable():
            return f"{self.name} is empty, longer than {self.longest} or not printable"
        return None


Part = Int | Text | type


def decode(kind: str, cursor: str | None, parts: Sequence[Part]) -> list[Any] | None:
    """The key inside `cursor` (None for no cursor): signed by this deployment, of list `kind`,
    each part of its type and range; else `bad_cursor` naming the problem."""
    if cursor is None:
        return None
    doc = _verified(cursor)
    if not (isinstance(doc, list) and doc and doc[0] == kind and len(doc) == len(parts) + 1):
        raise bad_cursor()
    for value, part in zip(doc[1:], parts, strict=True):
        problem = _part_problem(value, part)
        if problem is not None:
            raise bad_cursor(problem)
    return list(doc[1:])


def kind_of(cursor: str) -> str | None:
    """The list a signed cursor belongs to (None when it names none); `bad_cursor` if unsigned."""
    doc = _verified(cursor)
    return doc[0] if isinstance(doc, list) and doc and isinstance(doc[0], str) else None


def _verified(cursor: str) -> Any:
    """The cursor's JSON document, once its signature matches."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except (ValueError, binascii.Error):
        raise bad_cursor("not base64url") from None
    body = raw[MAC_BYTES:]
    if len(raw) <= MAC_BYTES or not hmac.compare_digest(raw[:MAC_BYTES], _mac(body)):
        raise bad_cursor("its signature does not match (it was edited, or is not a cursor)")
    try:
        return json.loads(body)
    except ValueError:
        raise bad_cursor("not a cursor document") from None


def _part_problem(value: Any, part: Part) -> str | None:
    if isinstance(part, type):
        return None if type(value) is part else f"a {type(value).__name__} is not a {part}"
    return part.problem(value)


def bad_cursor(problem: str = "") -> RequestError:
    why = f" ({problem})" if problem else ""
    return RequestError(
        "bad_cursor",
        f"cursor: not a cursor of this list{why}; pass back the next_cursor of the previous "
        "page unchanged, or leave it out to start from the beginning",
        field="cursor",
    )


def page(items: list[T], limit: int, key: Any, kind: str) -> Page[T]:
    """A page from up to `limit + 1` fetched rows: the extra row only says more exist."""
    if len(items) <= limit:
        return Page(items, None)
    shown = items[:limit]
    return Page(shown, encode(kind, key(shown[-1])))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def us(instant: datetime) -> int:
    """An instant as integer microseconds since the epoch (exact, for cursors)."""
    return (instant - _EPOCH) // timedelta(microseconds=1)


def from_us(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


# Key parts of the lists' cursors: instants as microseconds (1970 to 9999), the priority and
# intake sequence of a task, ids and names as printable text.
TIME = Int("time", 0, us(datetime(9999, 12, 31, tzinfo=UTC)))
PRIORITY = Int("priority", 1, 10)
SEQ = Int("seq", 0, 2**63 - 1)
TASK_ID = Text("id", 200)
DEAD_ID = Text("id", 36)
NAME = Text("name", 200)
