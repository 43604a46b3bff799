"""Opaque list cursors: the last row's sort key, tagged with the list it belongs to.

A cursor is URL-safe base64 of a small JSON array; callers pass `next_cursor` back unchanged.
A cursor of another list, or one that was edited, is refused with a message naming `cursor`.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

from scheduler.errors import RequestError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a list and the cursor of the next (None on the last page)."""

    items: list[T]
    next_cursor: str | None

    def as_dict(self) -> dict[str, Any]:
        """The API's page body: `{"items": [...], "next_cursor": ...}`."""
        return {"items": self.items, "next_cursor": self.next_cursor}


def encode(kind: str, key: Sequence[Any]) -> str:
    text = json.dumps([kind, *key], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode(kind: str, cursor: str | None, types: Sequence[type]) -> list[Any] | None:
    """The key inside `cursor` (None for no cursor), checked against the list's key types."""
    if cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        doc = json.loads(raw)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        doc = None
    ok = (
        isinstance(doc, list)
        and len(doc) == len(types) + 1
        and doc[0] == kind
        and all(type(v) is t for v, t in zip(doc[1:], types, strict=True))
    )
    if not ok:
        raise bad_cursor()
    return list(doc[1:])


def bad_cursor() -> RequestError:
    return RequestError(
        "bad_cursor",
        "cursor: not a cursor of this list; pass back the next_cursor of the previous "
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
