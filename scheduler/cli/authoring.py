"""Verbs that make work over the management API: `delayed add` and `schedules backfill`.

Both send an `Idempotency-Key` of their own (a new UUID per run) and retry with it when the
daemon is unreachable, failing (5xx) or still running the first attempt (409
`idempotency_key_in_use`): a retry gets the first attempt's answer, never a second task or a
second firing. Exit codes as for every operator verb (`scheduler.cli.apiclient`).
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.parse
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from scheduler.cli.apiclient import (
    OK,
    UNAVAILABLE,
    USAGE,
    ApiClient,
    ApiFailure,
    table,
)
from scheduler.cli.args import instant
from scheduler.durations import parse_duration
from scheduler.errors import DurationError

ATTEMPTS = 3
RETRY_PAUSE = 1.0  # seconds between attempts
MAX_DATA_BYTES = 1024 * 1024  # --data (or its file): the API refuses larger bodies anyway
Verb = Callable[[ApiClient, argparse.Namespace], tuple[Any, str, int]]
Runner = Callable[[Verb], Callable[[argparse.Namespace], int]]


def register_delayed(verbs: Any, common: argparse.ArgumentParser, runner: Runner) -> None:
    """`scheduler delayed add`; `runner` turns a verb into the command (ops.py's, shared by
    every operator verb: client, errors, output)."""
    add = verbs.add_parser(
        "add", parents=[common], help="schedule a delayed task (POST /v1/delayed)"
    )
    add.add_argument("--subject", required=True, help="target subject, e.g. mq.tasks.work")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--at", type=instant, help="due time, RFC 3339 with an offset")
    when.add_argument(
        "--in", dest="in_", type=_duration, metavar="DURATION", help="from now: 90s, 5m, 1h30m"
    )
    add.add_argument("--data", type=_data, default={}, help="a JSON object, or @FILE holding one")
    add.add_argument("--org-id", help="the envelope's org_id")
    add.add_argument("--id", help="the envelope id (default: made by the daemon)")
    add.set_defaults(func=runner(_delayed_add))


def register_schedules(verbs: Any, common: argparse.ArgumentParser, runner: Runner) -> None:
    """`scheduler schedules backfill` (`runner` as for `register_delayed`)."""
    fill = verbs.add_parser(
        "backfill",
        parents=[common],
        help="fire a job's occurrences in a past window, each once",
    )
    fill.add_argument("name", help="the job's name")
    fill.add_argument(
        "--from", dest="from_", metavar="T", required=True, type=instant, help="RFC 3339"
    )
    fill.add_argument(
        "--to", metavar="T", required=True, type=instant, help="RFC 3339, not in the future"
    )
    fill.add_argument("--dry-run", action="store_true", help="count the occurrences, fire none")
    fill.set_defaults(func=runner(_backfill))


def _duration(text: str) -> str:
    """A duration as the API takes it (`in`): seconds with at most millisecond digits."""
    try:
        seconds = parse_duration(text).total_seconds()
    except DurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"


def _data(text: str) -> dict[str, Any]:
    """`--data`: a JSON object given inline, or `@FILE` (at most MAX_DATA_BYTES)."""
    raw = text
    if text.startswith("@"):
        try:
            with Path(text[1:]).open("rb") as f:
                content = f.read(MAX_DATA_BYTES + 1)
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"{text}: {exc.strerror}") from None
        if len(content) > MAX_DATA_BYTES:
            raise argparse.ArgumentTypeError(f"{text}: larger than {MAX_DATA_BYTES} bytes")
        raw = content.decode("utf-8", errors="replace")
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {type(doc).__name__}")
    return doc


def keyed_call(client: ApiClient, method: str, path: str, body: dict[str, Any]) -> Any:
    """`client.call` under a new Idempotency-Key, retried with that key while the daemon is
    unreachable, failing or still busy with an earlier attempt."""
    headers = {"Idempotency-Key": str(uuid.uuid4())}
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return client.call(method, path, body=body, headers=headers)
        except ApiFailure as exc:
            if attempt == ATTEMPTS or not _retryable(exc):
                raise
        time.sleep(RETRY_PAUSE)
    raise AssertionError("unreachable")  # the loop returns or raises


def _retryable(exc: ApiFailure) -> bool:
    if exc.exit_code == UNAVAILABLE:
        return True
    return isinstance(exc.body, dict) and exc.body.get("code") == "idempotency_key_in_use"


def _delayed_add(client: ApiClient, args: argparse.Namespace) -> tuple[Any, str, int]:
    body: dict[str, Any] = {"subject": args.subject, "data": args.data}
    body |= {"at": args.at} if args.at else {"in": args.in_}
    body |= {k: v for k, v in (("org_id", args.org_id), ("id", args.id)) if v is not None}
    doc = keyed_call(client, "POST", "/v1/delayed", body)
    return doc, f"scheduled {doc['id']} to {doc['target']} due {doc['due_at']}", OK


def _backfill(client: ApiClient, args: argparse.Namespace) -> tuple[Any, str, int]:
    if datetime.fromisoformat(args.from_) >= datetime.fromisoformat(args.to):
        raise ApiFailure(USAGE, "schedules backfill: --from must be before --to")
    body = {"from": args.from_, "to": args.to, "dry_run": args.dry_run}
    path = f"/v1/schedules/{urllib.parse.quote(args.name, safe='')}/backfill"
    doc = keyed_call(client, "POST", path, body)
    planned = doc["status"] == "planned"
    fires = doc["occurrences"] - doc["already_fired"] if planned else doc["fired"]
    head = (
        f"{args.name}: {doc['occurrences']} occurrences in [{args.from_}, {args.to}); "
        f"{'would fire' if planned else 'fired'} {fires}, already fired {doc['already_fired']}"
    )
    if doc.get("in_flight"):
        head += f", in flight elsewhere {doc['in_flight']} (not fired: retry in a minute)"
    rows = [(i["scheduled_for"], i["status"], i["msg_id"], i.get("seq")) for i in doc["items"]]
    if rows:
        head += "\n\n" + table(rows, ["OCCURRENCE", "STATUS", "MSG ID", "SEQ"])
    return doc, head, OK
