"""Operator verbs over the management API: `status`, `schedules`, `delayed`, `dlq`.

Every verb takes `--url` (or `SCHEDULER_API_URL`, default http://127.0.0.1:8055), `--token` (or
`SCHEDULER_ADMIN_TOKEN`, then `SCHEDULER_READ_TOKEN`) and `--json` (the API's JSON, for scripts);
without `--json` it prints a table for a person. Exit codes: see `scheduler.commands.apiclient`.
"""

from __future__ import annotations

import argparse
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from scheduler.commands import authoring
from scheduler.commands.apiclient import OK, REFUSED, ApiClient, ApiFailure, emit, fail, table
from scheduler.durations import parse_duration

Verb = Callable[[ApiClient, argparse.Namespace], tuple[Any, str, int]]


def register(sub: Any) -> None:
    """Add the operator verbs to the top-level `scheduler` parser."""
    common = _common()
    status = sub.add_parser("status", parents=[common], help="leader, pending, due, dead letters")
    status.set_defaults(func=_runner(_status))
    _schedules(sub, common)
    _delayed(sub, common)
    _dlq(sub, common)


def _common() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--url", help="management API (default $SCHEDULER_API_URL or :8055)")
    p.add_argument("--token", help="bearer token (default $SCHEDULER_ADMIN_TOKEN, $..._READ_...)")
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    return p


def _paging(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", type=int, default=50, help="rows per page (1-500)")
    p.add_argument("--cursor", help="start after this cursor (printed under a full page)")
    p.add_argument("--all", action="store_true", help="follow every page")


def _runner(verb: Verb) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            client = ApiClient.from_args(args.url, args.token, args.timeout)
            doc, text, code = verb(client, args)
        except ApiFailure as exc:
            return fail(exc, args.json)
        emit(doc, args.json, text)
        return code

    return run


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="")


def _instant(text: str) -> str:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an RFC 3339 time") from exc
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} needs an offset or Z (2026-11-22T06:00Z)")
    return value.isoformat()


def _pages(client: ApiClient, path: str, args: argparse.Namespace, query: dict) -> dict:
    """One page, or every page with --all; `next_cursor` is that of the last page read."""
    items: list[Any] = []
    cursor = args.cursor
    while True:
        got = client.call("GET", path, {**query, "limit": args.limit, "cursor": cursor})
        items += got["items"]
        cursor = got["next_cursor"]
        if not (args.all and cursor):
            return {"items": items, "next_cursor": cursor}


def _listing(doc: dict, columns: dict[str, Callable[[dict], Any]]) -> tuple[Any, str, int]:
    """A page as a table of `columns` (header -> cell of an item), and how to get the next."""
    rows = [[cell(item) for cell in columns.values()] for item in doc["items"]]
    more = f"\nmore: --cursor {doc['next_cursor']}" if doc["next_cursor"] else ""
    return doc, table(rows, list(columns)) + more, OK


def _field(name: str) -> Callable[[dict], Any]:
    return lambda item: item[name]


# -- status ------------------------------------------------------------------------------------
def _status(client: ApiClient, _: argparse.Namespace) -> tuple[Any, str, int]:
    s = client.call("GET", "/v1/stats")
    leader = s["leader"]
    who = f"{leader['instance']} (epoch {leader['epoch']}, since {leader['since']})"
    late = s["lateness_ms"]
    due = "  ".join(f"{k}: {v}" for k, v in s["due"].items())
    lines = [
        f"leader        {who if leader['instance'] else 'none'}",
        f"epoch         {s['epoch']}",
        f"pending       {s['pending']}",
        f"due within    {due}",
        f"lateness      p50 {_ms(late['p50'])}  p99 {_ms(late['p99'])}  "
        f"({late['samples']} deliveries, last 5 min)",
        f"dead letters  {s['dead_letters_unresolved']} unresolved",
    ]
    if s["pending_by_subject"]:
        rows = [(r["subject"], r["pending"]) for r in s["pending_by_subject"]]
        lines += ["", table(rows, ["SUBJECT", "PENDING"])]
    return s, "\n".join(lines), OK


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


# -- schedules ---------------------------------------------------------------------------------
def _schedules(sub: Any, common: argparse.ArgumentParser) -> None:
    group = sub.add_parser(
        "schedules", help="cron jobs: list, show, pause, resume, trigger, backfill"
    )
    verbs = group.add_subparsers(title="verbs", metavar="VERB", required=True)
    ls = verbs.add_parser("list", parents=[common], help="cron jobs with their state")
    ls.add_argument("--removed", action="store_true", help="jobs removed from YAML instead")
    _paging(ls)
    ls.set_defaults(func=_runner(_schedules_list))
    for name, what, verb in (
        ("show", "a job's next occurrences and last fires", _schedule_show),
        ("pause", "stop firing a job (kept across reloads)", _schedule_action("pause")),
        ("resume", "undo an operator's pause", _schedule_action("resume")),
        ("trigger", "fire a job once now", _schedule_action("trigger")),
    ):
        p = verbs.add_parser(name, parents=[common], help=what)
        p.add_argument("name", help="the job's name")
        p.set_defaults(func=_runner(verb))
    authoring.register_schedules(verbs, common, _runner)


def _schedules_list(client: ApiClient, args: argparse.Namespace) -> tuple[Any, str, int]:
    doc = _pages(client, "/v1/schedules", args, {"active": not args.removed})
    keys = {"NAME": "name", "CRON": "cron", "TZ": "timezone", "SUBJECT": "subject"}
    keys |= {"PAUSED": "paused", "FAILED": "failed_reason", "LAST FIRED": "last_fired_at"}
    return _listing(doc, {header: _field(key) for header, key in keys.items()})


def _schedule_show(client: ApiClient, args: argparse.Namespace) -> tuple[Any, str, int]:
    j = client.call("GET", f"/v1/schedules/{_quote(args.name)}")
    paused = "no"
    if j["paused"]:
        paused = "in YAML" if j["paused_in_yaml"] else f"by {j['paused_by']} at {j['paused_at']}"
    lines = [
        f"{j['name']}  {j['cron']}  ({j['timezone']}) -> {j['subject']}",
        f"defined at   {j['file']}:{j['line']}",
        f"paused       {paused}",
        f"failed       {_failed(j)}",
        f"last         {j['last_scheduled_for']} (fired {j['last_fired_at']})",
        "",
        "next occurrences:",
        *(f"  {o['scheduled_for']}" for o in j["next"]),
        "",
        table(
            [
                (f["scheduled_for"], f["fired_at"], f["lateness_ms"], f["manual"], f["instance"])
                for f in j["fires"]
            ],
            ["SCHEDULED FOR", "FIRED AT", "LATE MS", "MANUAL", "INSTANCE"],
        ),
    ]
    return j, "\n".join(lines), OK


def _failed(job: dict[str, Any]) -> str:
    if not job.get("failed"):
        return "no"
    return f"{job['failed_reason']} at {job['failed_at']}: {job['failed_error']}"


def _schedule_action(action: str) -> Verb:
    def run(client: ApiClient, args: argparse.Namespace) -> tuple[Any, str, int]:
        doc = client.call("POST", f"/v1/schedules/{_quote(args.name)}/{action}")
        extra = f" as {doc['msg_id']} ({doc['stream']} #{doc['seq']})" if "msg_id" in doc else ""
        return doc, f"{args.name}: {doc['status']}{extra}", OK

    return run


# -- delayed tasks -----------------------------------------------------------------------------
def _delayed(sub: Any, common: argparse.ArgumentParser) -> None:
    group = sub.add_parser("delayed", help="delayed tasks: add, list, show, cancel, reschedule")
    verbs = group.add_subparsers(title="verbs", metavar="VERB", required=True)
    ls = verbs.add_parser("list", parents=[common], help="tasks in firing order")
    ls.add_argument("--subject", help="target subject (`mq.x.>`: a prefix)")
    ls.add_argument("--org-id", help="envelope org_id (fired tasks keep none)")
    ls.add_argument(
        "--status",
        help="pending, in_doubt, claimed, fired (in the order they fired), cancelled, expired, "
        "dead; none: all, fired last",
    )
    ls.add_argument("--due-before", type=_instant, help="RFC 3339")
    ls.add_argument("--due-after", type=_instant, help="RFC 3339")
    _paging(ls)
    ls.set_defaults(func=_runner(_delayed_list))
    show = verbs.add_parser("show", parents=[common], help="one task and its deliveries")
    show.add_argument("id")
    show.set_defaults(func=_runner(_delayed_show))
    cancel = verbs.add_parser("cancel", parents=[common], help="cancel a pending task")
    cancel.add_argument("id")
    cancel.set_defaults(func=_runner(_delayed_cancel))
    move = verbs.add_parser("reschedule", parents=[common], help="move a pending task")
    move.add_argument("id")
    when = move.add_mutually_exclusive_group(required=True)
    when.add_argument("--at", type=_instant, help="new due time, RFC 3339 with offset")
    when.add_argument(
        "--in", dest="in_", type=parse_duration, metavar="DURATION", help="from now: 90s, 5m"
    )
    move.set_defaults(func=_runner(_delayed_reschedule))
    authoring.register_delayed(verbs, common, _runner)


def _delayed_list(client: ApiClient, args: argparse.Namespace) -> tuple[Any, str, int]:
    query = {
        "subject": args.subject,
        "org_id": args.org_id,
        "status": args.status,
        "due_before": args.due_before,
        "due_after": args.due_after,
    }
    doc = _pages(client, "/v1/delayed", args, query)
    keys = {"ID": "id", "TARGET": "target", "STATUS": "status", "DUE AT": "due_at"}
    keys |= {"PRIO": "priority", "ATTEMPTS": "attempts"}
    return _listing(doc, {header: _field(key) for header, key in keys.items()})


def _delayed_show(client: ApiClient, args: argparse.Namespace) -> tuple[Any, str, int]:
    t = client.call("GET", f"/v1/delayed/{_quote(args.id)}")
    fields = ("id", "target", "status", "priority", "due_at", "scheduled_for", "expires_at")
    lines = [f"{k:<14}{t[k] if t[k] is not None else '-'}" for k in fields]
    lines += [f"{'attempts':<14}{t['attempts']}", f"{'last error':<14}{t['last_error'] or '-'}"]
    if t["deliveries"]:
        rows = [
            (d["fired_at"], d["attempt"], d["stream"], d["stream_seq"]) for d in t["deliveries"]
        ]
        lines += ["", table(rows, ["FIRED AT", "ATTEMPT", "STREAM", "SEQ"])]
    return t, "\n".join(lines), OK


def _delayed_cancel(client: ApiClient, args: argparse.Namespace) -> tuple[Any, str, int]:
    doc = client.call("DELETE", f"/v1/delayed/{_quote(args.id)}")
    return doc, f"{args.id}: {doc['status']}", OK


def _delayed_reschedule(client: ApiClient, args: argparse.Namespace) -> tuple[Any, str, int]:
    at = args.at or (datetime.now(UTC) + args.in_).isoformat()
    doc = client.call("PATCH", f"/v1/delayed/{_quote(args.id)}", body={"delay_until": at})
    return doc, f"{args.id}: {doc['status']}, due at {doc.get('due_at')}", OK


# -- dead letters ------------------------------------------------------------------------------
def _dlq(sub: Any, common: argparse.ArgumentParser) -> None:
    group = sub.add_parser("dlq", help="dead letters: list, show, replay, resolve")
    verbs = group.add_subparsers(title="verbs", metavar="VERB", required=True)
    ls = verbs.add_parser("list", parents=[common], help="dead letters, newest first")
    _dlq_filter(ls)
    state = ls.add_mutually_exclusive_group()
    state.add_argument("--resolved", dest="resolved", action="store_true", default=None)
    state.add_argument("--unresolved", dest="resolved", action="store_false")
    _paging(ls)
    ls.set_defaults(func=_runner(_dlq_list))
    show = verbs.add_parser("show", parents=[common], help="one dead letter and its message")
    show.add_argument("id")
    show.set_defaults(func=_runner(_dlq_show))
    replay = verbs.add_parser(
        "replay", parents=[common], help="replay dead letters by id, or --matching a filter"
    )
    replay.add_argument("ids", nargs="*", metavar="ID")
    replay.add_argument("--matching", action="store_true", help="replay unresolved ones by filter")
    _dlq_filter(replay)
    replay.add_argument("--limit", type=int, default=100, help="with --matching: at most (1000)")
    replay.set_defaults(func=_runner(_dlq_replay))
    resolve = verbs.add_parser("resolve", parents=[common], help="mark handled (or --reopen)")
    resolve.add_argument("id")
    resolve.add_argument("--reopen", action="store_true", help="mark unresolved again")
    resolve.set_defaults(func=_runner(_dlq_resolve))


def _dlq_filter(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reason", help="e.g. publish_failed, invalid_envelope, target_refused")
    p.add_argument("--subject", help="target or original subject (`mq.x.>`: a prefix)")
    p.add_argument("--stage", choices=["intake", "firing", "replay"])


def _dlq_list(client: ApiClient, args: argparse.Namespace) -> tuple[Any, str, int]:
    query = {"reason": args.reason, "subject": args.subject, "stage": args.stage}
    doc = _pages(client, "/v1/dead-letters", args, {**query, "resolved": args.resolved})
    columns = {header: _field(key) for header, key in (("ID", "id"), ("STAGE", "stage"))}
    columns["REASON"] = _field("reason")
    columns["SUBJECT"] = lambda d: d["target"] or d["subject"]
    columns["LAST FAILED"] = _field("last_failed")
    return _listing(doc, columns)


def _dlq_show(client: ApiClient, args: argparse.Namespace) -> tuple[Any, str, int]:
    d = client.call("GET", f"/v1/dead-letters/{_quote(args.id)}")
    fields = ("id", "original_id", "stage", "reason", "subject", "target", "attempts")
    lines = [f"{k:<13}{d[k] if d[k] is not None else '-'}" for k in fields]
    lines += [
        f"{'error':<13}{d['error']}",
        f"{'last failed':<13}{d['last_failed']}",
        f"{'resolved':<13}{'yes by ' + str(d['resolved_by']) if d['resolved'] else 'no'}",
        f"{'replayed':<13}{d['replayed_at'] or 'no'}",
        f"{'size':<13}{_dlq_size(d)}",
    ]
    return d, "\n".join(lines), OK


def _dlq_size(d: dict[str, Any]) -> str:
    """The message's size as received, and whether the table kept only its first bytes."""
    size = d.get("raw_size")
    if size is None:
        return "-"
    return f"{size} bytes" + (
        " (cut: the DLQ stream holds it whole)" if d.get("raw_truncated") else ""
    )


def _dlq_replay(client: ApiClient, args: argparse.Namespace) -> tuple[Any, str, int]:
    if args.matching == bool(args.ids):
        raise ApiFailure(2, "dlq replay: give dead-letter ids, or --matching with a filter")
    if args.matching:
        body = {"reason": args.reason, "subject": args.subject, "stage": args.stage}
        body = {k: v for k, v in body.items() if v is not None}
        doc = client.call("POST", "/v1/dead-letters/replay", body={**body, "limit": args.limit})
        results = doc["results"]
    else:
        results = [_replay_one(client, dead_id) for dead_id in args.ids]
        doc = {"results": results}
    rows = [(r["id"], r["status"], r.get("task_id"), r.get("detail")) for r in results]
    refused = sum(r["status"] != "replayed" for r in results)
    text = table(rows, ["ID", "RESULT", "TASK", "DETAIL"])
    return doc, text, REFUSED if refused else OK


def _replay_one(client: ApiClient, dead_id: str) -> dict[str, Any]:
    try:
        return dict(client.call("POST", f"/v1/dead-letters/{_quote(dead_id)}/replay"))
    except ApiFailure as exc:
        if exc.exit_code != REFUSED or not isinstance(exc.body, dict):
            raise
        return {"id": dead_id, "status": exc.body.get("code"), "detail": exc.body.get("detail")}


def _dlq_resolve(client: ApiClient, args: argparse.Namespace) -> tuple[Any, str, int]:
    body = {"resolved": not args.reopen}
    d = client.call("PATCH", f"/v1/dead-letters/{_quote(args.id)}", body=body)
    state = f"resolved by {d['resolved_by']}" if d["resolved"] else "open"
    return d, f"{args.id}: {state}", OK
