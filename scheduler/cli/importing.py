"""`scheduler schedules import`: crontab files, Kubernetes CronJob manifests and Celery beat
configs to `scheduled_jobs` YAML (docs/migrating.md).

The YAML goes to stdout or `--out`; every file note, skipped entry, part not mapped and note
goes to stderr as `source:line: job: ...`. Exit status: 0 every entry mapped (notes are only
information), 1 some entry skipped or not fully mapped (the others are written), 2 an input
unreadable or an argument wrong (nothing written). Reads files only; talks to no server.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from scheduler.cron.imported import (
    MAX_INPUT_CHARS,
    Parsed,
    UnreadableInput,
    assemble,
    check_template,
    render,
    report,
)
from scheduler.cron.importers import KINDS, detect_kind, is_system_crontab, read_source

ALL_MAPPED, SOME_SKIPPED, UNREADABLE = 0, 1, 2
DESCRIPTION = """\
Read crontab files, Kubernetes CronJob manifests and Celery beat configs (parsed, never run)
and write scheduled_jobs YAML that `scheduler validate` accepts. Every entry that could not be
mapped, and why, goes to stderr as source:line: job: ... (docs/migrating.md walks each source).

Exit status: 0 every entry mapped; 1 some entry skipped or not fully mapped (the others are
written); 2 an input unreadable or an argument wrong (nothing written).
"""


def register(verbs: Any) -> None:
    """Add `import` to the `scheduler schedules` verbs."""
    p = verbs.add_parser(
        "import",
        help="crontab, Kubernetes CronJobs or Celery beat to scheduled_jobs YAML",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="a source file, '-' for stdin")
    p.add_argument(
        "--subject",
        required=True,
        type=_template,
        metavar="TEMPLATE",
        help="each job's subject; {name} is the job's name (e.g. mq.scheduled.{name})",
    )
    p.add_argument(
        "--from",
        dest="kind",
        choices=("auto", *KINDS),
        default="auto",
        help="the sources' format (default auto: .yaml/.yml cronjob, .py celery, else crontab)",
    )
    p.add_argument(
        "--timezone",
        type=_zone,
        default="UTC",
        metavar="ZONE",
        help="zone of entries whose source names none (default UTC)",
    )
    p.add_argument(
        "--system",
        action="store_true",
        help="crontab with a user column (/etc/crontab, /etc/cron.d/*: the default for those)",
    )
    p.add_argument("--out", type=Path, metavar="FILE", help="write the YAML here instead of stdout")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.set_defaults(func=cmd_import)


def _template(text: str) -> str:
    try:
        return check_template(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            str(exc).removeprefix(f"subject template {text!r}: ")
        ) from None


def _zone(text: str) -> str:
    try:
        ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError):
        raise argparse.ArgumentTypeError(
            f"unknown time zone {text!r} (use an IANA name like Europe/Berlin)"
        ) from None
    return text


def cmd_import(args: argparse.Namespace) -> int:
    """Read every source, write the YAML, report; the exit status says how complete it was."""
    if args.out is not None and args.out.exists() and not args.force:
        return _fail(f"{args.out} exists (pass --force to overwrite it)")
    if args.out is not None and not args.out.parent.is_dir():
        return _fail(f"--out {args.out}: folder {args.out.parent} does not exist")
    try:
        parsed = [_read(path, args) for path in args.files]
    except UnreadableInput as exc:
        return _fail(str(exc))
    outcome = assemble(parsed, args.subject, args.timezone)
    text = render(outcome)
    for line in report(outcome):
        print(line, file=sys.stderr)
    if args.out is not None:
        try:
            _write(args.out, text)
        except OSError as exc:
            return _fail(f"--out {args.out}: {exc.strerror or exc}")
    else:
        sys.stdout.write(text)
    lost = sum(1 for job in outcome.jobs if job.lost)
    total = len(outcome.jobs) + len(outcome.skipped)
    where = f" to {args.out}" if args.out is not None else ""
    print(
        f"imported {len(outcome.jobs)} of {total} entries{where}: {len(outcome.skipped)} "
        f"skipped, {lost} not fully mapped",
        file=sys.stderr,
    )
    return ALL_MAPPED if outcome.complete else SOME_SKIPPED


def _fail(message: str) -> int:
    print(f"scheduler: schedules import: {message}", file=sys.stderr)
    return UNREADABLE


def _read(path: str, args: argparse.Namespace) -> Parsed:
    if path == "-":
        text, source = sys.stdin.read(MAX_INPUT_CHARS + 1), "<stdin>"
    else:
        try:
            with open(path, encoding="utf-8") as f:
                text, source = f.read(MAX_INPUT_CHARS + 1), path
        except OSError as exc:
            raise UnreadableInput(f"{path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise UnreadableInput(f"{path}: not UTF-8 text (byte {exc.start})") from None
    kind = detect_kind(source, text) if args.kind == "auto" else args.kind
    system = args.system or is_system_crontab(os.path.abspath(path))
    return read_source(text, kind, source, system=system)


def _write(path: Path, text: str) -> None:
    """Write whole or not at all: a temporary file beside it, renamed over it."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)
