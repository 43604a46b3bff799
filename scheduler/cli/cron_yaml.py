"""`scheduler validate` and `scheduler next`: lint the cron YAML and preview its occurrences."""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from itertools import islice

from scheduler.clock import rfc3339, to_rfc3339
from scheduler.cron.expression import occurrences
from scheduler.cron.jobs import Job, ScheduleSet, load_dir

DIR_ENV = "SCHEDULER_SCHEDULES_DIR"


def _add_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "dir",
        nargs="?",
        default=None,
        metavar="DIR",
        help=f"folder of scheduled_jobs YAML files (default: ${DIR_ENV} or 'schedules')",
    )


def _load(args: argparse.Namespace) -> ScheduleSet | None:
    folder = args.dir or os.environ.get(DIR_ENV) or "schedules"
    try:
        return load_dir(folder)
    except NotADirectoryError as exc:
        print(f"scheduler: {exc}", file=sys.stderr)
        return None


def _print_errors(found: ScheduleSet) -> None:
    for error in found.errors:
        print(error, file=sys.stderr)


def configure_validate(parser: argparse.ArgumentParser) -> None:
    """Arguments of `scheduler validate [DIR]`."""
    _add_dir(parser)


def cmd_validate(args: argparse.Namespace) -> int:
    """Print every problem as `file:line: job: message`; exit 1 if there is any, else 0."""
    found = _load(args)
    if found is None:
        return 2
    files = _plural(len(found.files), "file")
    if found.errors:
        _print_errors(found)
        print(f"{_plural(len(found.errors), 'error')} in {files}", file=sys.stderr)
        return 1
    print(f"{_plural(len(found.jobs), 'job')} OK in {files}")
    return 0


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _instant(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an RFC 3339 time") from exc
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} needs an offset or Z (e.g. 2026-11-22T06:00Z)")
    return value


def configure_next(parser: argparse.ArgumentParser) -> None:
    """Arguments of `scheduler next [DIR] [--name NAME] [--count N] [--after TIME] [--json]`."""
    _add_dir(parser)
    parser.add_argument("--name", help="only this job")
    parser.add_argument("--count", type=_count, default=5, help="occurrences per job (default 5)")
    parser.add_argument("--after", type=_instant, help="RFC 3339 start, exclusive (default: now)")
    parser.add_argument("--json", action="store_true", help="print {job: [RFC 3339 UTC, ...]}")


def cmd_next(args: argparse.Namespace) -> int:
    """Print each job's next occurrences; exit 1 if some file had errors, 2 on a bad --name."""
    found = _load(args)
    if found is None:
        return 2
    jobs = list(found.jobs)
    if args.name is not None:
        jobs = [job for job in jobs if job.name == args.name]
        if not jobs:
            known = ", ".join(job.name for job in found.jobs) or "none"
            print(f"scheduler: no valid job named {args.name!r} (known: {known})", file=sys.stderr)
            return 2
    after = args.after or datetime.now(UTC)
    coming = {
        job.name: list(islice(occurrences(job.cron, after, job.timezone), args.count))
        for job in jobs
    }
    if args.json:
        print(json.dumps({name: [rfc3339(t) for t in times] for name, times in coming.items()}))
    else:
        for job in jobs:
            _print_job(job, coming[job.name])
    _print_errors(found)
    return 1 if found.errors else 0


def _print_job(job: Job, times: list[datetime]) -> None:
    paused = "  [paused]" if job.paused else ""
    print(f"{job.name}  {job.cron.text}  ({job.timezone.key}) -> {job.subject}{paused}")
    for instant in times:
        local = instant.astimezone(job.timezone)
        print(f"  {local:%Y-%m-%d %H:%M:%S %Z (%z)}   {to_rfc3339(instant)}")
