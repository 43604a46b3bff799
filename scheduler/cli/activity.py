"""`scheduler activity`: the operator actions the daemon recorded, newest first
(`GET /v1/activity`), as a table or (`--json`) the API's JSON."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from scheduler.cli.apiclient import OK, ApiClient, table
from scheduler.cli.args import instant
from scheduler.cli.render import when
from scheduler.durations import parse_duration
from scheduler.errors import DurationError

MAX_LIMIT = 500


def register(sub: Any, common: argparse.ArgumentParser, runner: Any) -> None:
    """Add `activity` to the top-level parser (`runner` wraps a verb as `ops` does)."""
    p = sub.add_parser(
        "activity", parents=[common], help="operator actions: who did what, when, with what result"
    )
    p.add_argument("--action", help="pause, resume, trigger, backfill, cancel, replay, ...")
    p.add_argument("--target", help="job name, task id or dead-letter id (exact)")
    p.add_argument("--who", help="a prefix of who: admin, or admin@10.0.0.7")
    p.add_argument("--since", type=_instant, help="RFC 3339 time, or a duration ago (1h, 2d)")
    p.add_argument("--until", type=_instant, help="RFC 3339 time, or a duration ago")
    p.add_argument("--limit", type=_limit, default=50, help=f"rows (1-{MAX_LIMIT})")
    p.add_argument("--cursor", help="start after this cursor (printed under a full page)")
    p.set_defaults(func=runner(listing))


def listing(client: ApiClient, args: argparse.Namespace) -> tuple[Any, str, int]:
    query = {
        "action": args.action,
        "target": args.target,
        "who": args.who,
        "since": args.since,
        "until": args.until,
        "limit": args.limit,
        "cursor": args.cursor,
    }
    doc = client.call("GET", "/v1/activity", query)
    rows = [_row(item) for item in doc["items"]]
    text = table(rows, ["AT", "WHO", "ACTION", "TARGET", "OUTCOME", "DETAIL"])
    if doc["next_cursor"]:
        text += f"\nmore: --cursor {doc['next_cursor']}"
    return doc, text, OK


def _row(item: dict[str, Any]) -> list[Any]:
    who = item["who"] + (f" (console {item['session']})" if item["via"] == "console" else "")
    detail = " ".join(f"{k}={_short(v)}" for k, v in item["detail"].items())
    outcome = f"{item['outcome']} ({item['http_status']})"
    return [when(item["at"]), who, item["action"], item["target"], outcome, detail]


def _short(value: Any, longest: int = 60) -> str:
    text = str(value)
    return text if len(text) <= longest else text[: longest - 1] + "…"


def _limit(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"{text!r}: a number from 1 to {MAX_LIMIT}")
    return int(text)


def _instant(text: str) -> str:
    """An RFC 3339 time with an offset, or a duration (`90m`, `2d`) meaning that long ago."""
    try:
        return (datetime.now(UTC) - parse_duration(text)).isoformat()
    except DurationError:
        return instant(text, "is neither an RFC 3339 time nor a duration (1h, 2d)")
