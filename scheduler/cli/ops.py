"""Operator verbs over the management API: `status`, `schedules`, `delayed`, `dlq`, `activity`.

Every verb takes `--url` (or `SCHEDULER_API_URL`, default http://127.0.0.1:8055), `--token` (or
`SCHEDULER_ADMIN_TOKEN`, then `SCHEDULER_READ_TOKEN`) and `--json` (the API's JSON, for scripts);
without `--json` it prints a table for a person. Exit codes: see `scheduler.cli.apiclient`;
besides, `status` exits 1 when the daemon reports errors in the schedules YAML (as `scheduler
validate` does for the same errors), and every verb exits 141 when stdout is closed early.
Text output writes times, durations and missing values one way (`scheduler.cli.render`).
"""

from __future__ import annotations

import argparse
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from scheduler.cli import activity, authoring, importing
from scheduler.cli.apiclient import OK, REFUSED, ApiClient, ApiFailure, emit, fail, table
from scheduler.cli.args import instant
from scheduler.cli.render import (
    fields,
    header_lines,
    ms,
    next_run,
    payload_lines,
    plural,
    printable,
    problems_block,
    text,
    when,
)
from scheduler.durations import parse_duration
from scheduler.partitions import spans

Verb = Callable[[ApiClient, argparse.Namespace], tuple[Any, str, int]]
YAML_ERRORS = REFUSED  # `status` when the daemon reports schedule YAML errors: as `validate`
DLQ_STATES = {"unresolved": False, "resolved": True, "all": None}


def register(sub: Any) -> None:
    """Add the operator verbs to the top-level `scheduler` parser."""
    common = _common()
    status = sub.add_parser(
        "status",
        parents=[common],
        help="leader, pending, due, dead letters, YAML errors (exit 1 while there are any)",
    )
    status.set_defaults(func=_runner(_status))
    _schedules(sub, common)
    _delayed(sub, common)
    _dlq(sub, common)
    activity.register(sub, common, _runner)


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


def _pages(
    client: ApiClient, path: str, args: argparse.Namespace, query: dict[str, Any]
) -> dict[str, Any]:
    """One page, or every page with --all; `next_cursor` is that of the last page read."""
    items: list[Any] = []
    cursor = args.cursor
    while True:
        got = client.call("GET", path, {**query, "limit": args.limit, "cursor": cursor})
        items += got["items"]
        cursor = got["next_cursor"]
        if not (args.all and cursor):  # other keys (`problems`) as the last page says
            return {**got, "items": items, "next_cursor": cursor}


def _listing(
    doc: dict[str, Any], columns: dict[str, Callable[[dict[str, Any]], Any]], empty: str = ""
) -> tuple[Any, str, int]:
    """A page as a table of `columns` (header -> cell of an item), and how to get the next;
    `empty` instead of a bare header when nothing matched."""
    if empty and not doc["items"] and not doc["next_cursor"]:
        return doc, empty, OK
    rows = [[cell(item) for cell in columns.values()] for item in doc["items"]]
    more = f"\nmore: --cursor {doc['next_cursor']}" if doc["next_cursor"] else ""
    return doc, table(rows, list(columns)) + more, OK


def _field(name: str) -> Callable[[dict[str, Any]], Any]:
    return lambda item: item[name]


# -- status ------------------------------------------------------------------------------------
def _status(client: ApiClient, _: argparse.Namespace) -> tuple[Any, str, int]:
    s = client.call("GET", "/v1/stats")
    problems = _problems(client)
    owners = client.call("GET", "/v1/leader")
    leader = s["leader"]
    late = s["lateness_ms"]
    due = "  ".join(f"{k}: {v}" for k, v in s["due"].items())
    lines = fields(
        [
            ("leader", _leader(leader)),
            ("epoch", text(s["epoch"])),
            ("pending", s["pending"]),
            ("due within", due),
            (
                "lateness",
                f"p50 {ms(late['p50'])}  p99 {ms(late['p99'])}  "
                f"({late['samples']} deliveries, last 5 min)",
            ),
            ("dead letters", f"{s['dead_letters_unresolved']} unresolved"),
            ("schedule YAML", f"{plural(len(problems), 'error')} (below)" if problems else "ok"),
            ("as of", when(s.get("at"))),
        ]
    )
    partitioned = _count(owners.get("partitions")) > 1
    if partitioned:
        lines[0] = fields([("partitions", _held(owners))])[0]
    if s["pending_by_subject"]:
        rows = [(r["subject"], r["pending"]) for r in s["pending_by_subject"]]
        lines += ["", table(rows, ["SUBJECT", "PENDING"])]
    if partitioned:
        lines += ["", _partition_table(owners)]
    if problems:
        lines += ["", *problems_block(problems)]
    shown = {k: owners.get(k) for k in ("partitions", "engines", "unowned", "map_readable")}
    doc = {**s, "problems": problems, "partition_map": shown}
    return doc, "\n".join(lines), YAML_ERRORS if problems else OK


def _problems(client: ApiClient) -> list[dict[str, Any]]:
    """The schedule YAML errors the daemon reports (the list answer carries them)."""
    return list(client.call("GET", "/v1/schedules", {"limit": 1}).get("problems") or [])


def _leader(leader: dict[str, Any]) -> str:
    if not leader.get("instance"):
        return "none"
    since = f", since {when(leader['since'])}" if leader.get("since") else ""
    return f"{printable(leader['instance'])} (epoch {text(leader.get('epoch'))}{since})"


def _count(value: Any) -> int:
    return value if type(value) is int else 1  # a daemon before partitions: one leader


def _held(owners: dict[str, Any]) -> str:
    """`60 of 64 held by 3 engines, 4 without an owner` (under P > 1)."""
    total, unowned = _count(owners.get("partitions")), list(owners.get("unowned") or [])
    if owners.get("map_readable") is False:
        return f"{total}, the lease bucket could not be read"
    engines = len(owners.get("engines") or [])
    line = f"{total - len(unowned)} of {total} held by {plural(engines, 'engine')}"
    return line + (f", {len(unowned)} WITHOUT AN OWNER" if unowned else "")


def _partition_table(owners: dict[str, Any]) -> str:
    """Each engine's partitions (count, which), then the ones nobody holds."""
    rows = [
        (printable(str(e.get("instance"))), e.get("count"), spans(_ints(e.get("partitions"))))
        for e in owners.get("engines") or []
    ]
    unowned = _ints(owners.get("unowned"))
    if unowned:
        rows.append(("(no owner)", len(unowned), spans(unowned)))
    return table(rows, ["ENGINE", "PARTITIONS", "WHICH"])


def _ints(value: Any) -> list[int]:
    return [p for p in value if type(p) is int] if isinstance(value, list) else []


# -- schedules ---------------------------------------------------------------------------------
def _schedules(sub: Any, common: argparse.ArgumentParser) -> None:
    group = sub.add_parser(
        "schedules", help="cron jobs: list, show, pause, resume, trigger, backfill, import"
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
        if name == "pause":
            p.add_argument("--note", help="why (kept with the job until resumed; 500 chars)")
    authoring.register_schedules(verbs, common, _runner)
    importing.register(verbs)  # reads files only: no --url, --token


def _schedules_list(client: ApiClient, args: argparse.Namespace) -> tuple[Any, str, int]:
    doc = _pages(client, "/v1/schedules", args, {"active": not args.removed})
    now = datetime.now(UTC)
    columns = {h: _field(k) for h, k in (("NAME", "name"), ("CRON", "cron"), ("TZ", "timezone"))}
    columns["SUBJECT"] = _field("subject")
    columns["STATE"] = _schedule_state
    columns["NEXT RUN"] = lambda j: next_run(j, now)
    columns["LAST FIRED"] = lambda j: when(j["last_fired_at"])
    none = "no removed cron jobs" if args.removed else "no cron jobs loaded"
    listed, listing, code = _listing(doc, columns, none)
    found = problems_block(doc.get("problems") or [])
    return listed, "\n".join([listing, *([""] if found else []), *found]), code


def _schedule_state(job: dict[str, Any]) -> str:
    """removed, failed (with its reason), paused, or active: what stops a job from firing."""
    if not job.get("active", True):
        return "removed"
    if job.get("failed"):
        reason = job.get("failed_reason")
        return f"failed ({printable(reason)})" if reason else "failed"
    if not job.get("paused"):
        return "active"
    note = job.get("pause_note")
    return f"paused: {printable(note)}" if note else "paused"


def _schedule_show(client: ApiClient, args: argparse.Namespace) -> tuple[Any, str, int]:
    j = client.call("GET", f"/v1/schedules/{_quote(args.name)}")
    head = f"{j['name']}  {j['cron']}  ({j['timezone']}) -> {j['subject']}"
    lines = [
        printable(head),
        *fields(
            [
                ("defined at", _defined_at(j)),
                ("paused", _paused(j)),
                ("failed", _failed(j)),
                ("last", _last(j)),
            ]
        ),
        "",
        "next occurrences:",
        *(_occurrence(o) for o in j["next"]),
        *([] if j["next"] else ["  none"]),
        "",
        _fires(j["fires"]),
    ]
    return j, "\n".join(lines), OK


def _defined_at(job: dict[str, Any]) -> str:
    if not job.get("file"):
        return "-"
    return printable(job["file"] if job.get("line") is None else f"{job['file']}:{job['line']}")


def _paused(job: dict[str, Any]) -> str:
    if not job["paused"]:
        return "no"
    if job["paused_in_yaml"]:
        return "in YAML"
    by = f"by {text(job.get('paused_by'))} at {when(job.get('paused_at'))}"
    note = job.get("pause_note")
    return f"{by}: {printable(note)}" if note else by


def _failed(job: dict[str, Any]) -> str:
    if not job.get("failed"):
        return "no"
    error = text(job.get("failed_error"))
    return f"{text(job.get('failed_reason'))} at {when(job.get('failed_at'))}: {error}"


def _last(job: dict[str, Any]) -> str:
    """The occurrence last handled and when it fired; a job that never fired says so, with
    the cursor it counts from (a new job's cursor is when it was loaded, not an occurrence)."""
    cursor, fired = job.get("last_scheduled_for"), job.get("last_fired_at")
    if fired is None:
        return "never fired" + (f" (occurrences after {when(cursor)})" if cursor else "")
    return f"{when(cursor)} (fired {when(fired)})"


def _occurrence(o: dict[str, Any]) -> str:
    at, fire_at = when(o["scheduled_for"]), when(o.get("fire_at"))
    return f"  {at}" + (f"  (fires {fire_at}: jitter)" if fire_at not in (at, "-") else "")


def _fires(fires: list[dict[str, Any]]) -> str:
    if not fires:
        return "no fires yet"
    rows = [
        (
            when(f["scheduled_for"]),
            when(f["fired_at"]),
            f["lateness_ms"],
            f["manual"],
            f["instance"],
        )
        for f in fires
    ]
    return table(rows, ["SCHEDULED FOR", "FIRED AT", "LATE MS", "MANUAL", "INSTANCE"])


def _schedule_action(action: str) -> Verb:
    def run(client: ApiClient, args: argparse.Namespace) -> tuple[Any, str, int]:
        note = getattr(args, "note", None)
        body = {"note": note} if note else None
        doc = client.call("POST", f"/v1/schedules/{_quote(args.name)}/{action}", body=body)
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
    ls.add_argument("--due-before", type=instant, help="RFC 3339")
    ls.add_argument("--due-after", type=instant, help="RFC 3339")
    _paging(ls)
    ls.set_defaults(func=_runner(_delayed_list))
    show = verbs.add_parser("show", parents=[common], help="one task and its deliveries")
    show.add_argument("id")
    show.set_defaults(func=_runner(_delayed_show))
    cancel = verbs.add_parser("cancel", parents=[common], help="cancel a pending task")
    cancel.add_argument("id")
    cancel.add_argument("--target", help=_TARGET_HELP)
    cancel.set_defaults(func=_runner(_delayed_cancel))
    move = verbs.add_parser("reschedule", parents=[common], help="move a pending task")
    move.add_argument("id")
    move.add_argument("--target", help=_TARGET_HELP)
    when = move.add_mutually_exclusive_group(required=True)
    when.add_argument("--at", type=instant, help="new due time, RFC 3339 with offset")
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
    columns = {h: _field(k) for h, k in (("ID", "id"), ("TARGET", "target"), ("STATUS", "status"))}
    columns["DUE AT"] = lambda t: when(t["due_at"])
    columns |= {"PRIO": _field("priority"), "ATTEMPTS": _field("attempts")}
    return _listing(doc, columns, "no delayed tasks match")


def _delayed_show(client: ApiClient, args: argparse.Namespace) -> tuple[Any, str, int]:
    t = client.call("GET", f"/v1/delayed/{_quote(args.id)}")
    pairs = [(k, text(t.get(k))) for k in ("id", "target", "status", "priority")]
    pairs += [(k, when(t.get(k))) for k in ("due_at", "scheduled_for", "expires_at", "fired_at")]
    pairs += [("attempts", text(t.get("attempts"))), ("last error", text(t.get("last_error")))]
    lines = fields(pairs)
    if t["deliveries"]:
        rows = [
            (when(d["fired_at"]), d["attempt"], d["stream"], d["stream_seq"])
            for d in t["deliveries"]
        ]
        lines += ["", table(rows, ["FIRED AT", "ATTEMPT", "STREAM", "SEQ"])]
    return t, "\n".join(lines), OK


_TARGET_HELP = (
    "the task's target subject: needed only for a task published to the delay lane directly "
    "and not yet taken by intake (one scheduled through the API is found without it)"
)


def _delayed_cancel(client: ApiClient, args: argparse.Namespace) -> tuple[Any, str, int]:
    query = {"target": args.target}
    doc = client.call("DELETE", f"/v1/delayed/{_quote(args.id)}", query)
    return doc, f"{args.id}: {doc['status']}", OK


def _delayed_reschedule(client: ApiClient, args: argparse.Namespace) -> tuple[Any, str, int]:
    at = args.at or (datetime.now(UTC) + args.in_).isoformat()
    path, query = f"/v1/delayed/{_quote(args.id)}", {"target": args.target}
    doc = client.call("PATCH", path, query, body={"delay_until": at})
    return doc, f"{args.id}: {doc['status']}, due at {when(doc.get('due_at'))}", OK


# -- dead letters ------------------------------------------------------------------------------
def _dlq(sub: Any, common: argparse.ArgumentParser) -> None:
    group = sub.add_parser("dlq", help="dead letters: list, show, replay, resolve")
    verbs = group.add_subparsers(title="verbs", metavar="VERB", required=True)
    ls = verbs.add_parser("list", parents=[common], help="dead letters, newest first")
    _dlq_filter(ls)
    state = ls.add_mutually_exclusive_group()
    state.add_argument(
        "--state", choices=list(DLQ_STATES), default="unresolved", help="default: unresolved"
    )
    state.add_argument(
        "--resolved", dest="state", action="store_const", const="resolved", help="--state resolved"
    )
    state.add_argument(
        "--unresolved", dest="state", action="store_const", const="unresolved", help="the default"
    )
    _paging(ls)
    ls.set_defaults(func=_runner(_dlq_list))
    show = verbs.add_parser(
        "show", parents=[common], help="one dead letter: error, headers and payload"
    )
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
    doc = _pages(client, "/v1/dead-letters", args, {**query, "resolved": DLQ_STATES[args.state]})
    if not doc["items"] and args.state != "all" and not args.cursor:
        return doc, f"no {args.state} dead letters (--state all lists every one)", OK
    columns = {"ID": _field("id"), "STATE": _dlq_state, "STAGE": _field("stage")}
    columns["REASON"] = _field("reason")
    # as `dlq show` and the console name it: the target, else (none known) the subject it came on
    columns["TARGET"] = lambda d: d["target"] or f"- ({d['subject']})"
    columns["ATTEMPTS"] = _field("attempts")
    columns["LAST FAILED"] = lambda d: when(d["last_failed"])
    return _listing(doc, columns)


def _dlq_state(d: dict[str, Any]) -> str:
    """replayed (which resolves it), resolved by hand, or unresolved."""
    if d.get("replayed_at"):
        return "replayed"
    return "resolved" if d.get("resolved") else "unresolved"


def _dlq_show(client: ApiClient, args: argparse.Namespace) -> tuple[Any, str, int]:
    d = client.call("GET", f"/v1/dead-letters/{_quote(args.id)}")
    pairs = [(k, text(d.get(k))) for k in ("id", "original_id", "stage", "reason", "subject")]
    pairs += [("target", text(d.get("target"))), ("attempts", text(d.get("attempts")))]
    pairs += [("error", text(d.get("error"))), ("first seen", when(d.get("first_seen")))]
    pairs += [("last failed", when(d.get("last_failed"))), ("state", _dlq_state(d))]
    pairs += [("resolved", _resolved(d)), ("replayed", _replayed(d))]
    pairs += [("size", _dlq_size(d))]
    lines = [*fields(pairs), "", "headers:"]
    lines += [f"  {line}" for line in header_lines(d.get("headers") or {})]
    lines += ["", "payload:"]
    cut = bool(d.get("raw_truncated"))
    lines += [f"  {line}" for line in payload_lines(d.get("raw_base64"), d.get("payload"), cut)]
    return d, "\n".join(lines), OK


def _replayed(d: dict[str, Any]) -> str:
    return when(d["replayed_at"]) if d.get("replayed_at") else "no"


def _resolved(d: dict[str, Any]) -> str:
    if not d.get("resolved"):
        return "no"
    return f"by {text(d.get('resolved_by'))} at {when(d.get('resolved_at'))}"


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
    state = f"resolved by {text(d.get('resolved_by'))}" if d["resolved"] else "open"
    return d, f"{args.id}: {state}", OK
