"""The `scheduler` command line. Only this module configures logging."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from scheduler import __version__
from scheduler.errors import ConfigError, SchedulerError

OPEN_ISSUES = {
    "dlq": "dead-letter inspection and replay",
}


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"scheduler: configuration error: {exc}", file=sys.stderr)
        return 2
    except SchedulerError as exc:
        print(f"scheduler: {exc}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scheduler", description=__doc__)
    parser.add_argument("--version", action="version", version=f"mq-scheduler {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    run = sub.add_parser("run", help="run the daemon")
    _common(run)
    run.add_argument(
        "--embedded",
        action="store_true",
        help="start a local nats-server and PostgreSQL for whichever URL is not set",
    )
    run.set_defaults(func=cmd_run)

    mig = sub.add_parser("migrate", help="bring the PostgreSQL schema up to date (idempotent)")
    _common(mig)
    mig.add_argument("--revision", default="head", help="target revision (default: head)")
    mig.add_argument("--down", action="store_true", help="downgrade to --revision instead")
    mig.add_argument("--embedded", action="store_true", help="migrate the embedded PostgreSQL")
    mig.set_defaults(func=cmd_migrate)

    _schedule_commands(sub)
    _audit_commands(sub)
    for verb, what in OPEN_ISSUES.items():
        p = sub.add_parser(verb, help=f"{what} (not yet available)")
        p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        p.set_defaults(func=_not_yet(verb, what))
    return parser


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config file (keys as the SCHEDULER_* variables)")
    p.add_argument("--data-dir", help="data dir of embedded servers (default .scheduler-data)")


def _schedule_commands(sub: Any) -> None:
    from scheduler.commands import schedules

    val = sub.add_parser("validate", help="lint scheduled_jobs YAML files")
    schedules.configure_validate(val)
    val.set_defaults(func=schedules.cmd_validate)
    nxt = sub.add_parser("next", help="print the coming occurrences of cron jobs")
    schedules.configure_next(nxt)
    nxt.set_defaults(func=schedules.cmd_next)


def _audit_commands(sub: Any) -> None:
    from scheduler.audit import cli as audit  # PySpark is imported only when the audit runs

    aud = sub.add_parser("audit", help="the PySpark drift audit of a day's execution log")
    audit.configure_audit(aud)
    aud.set_defaults(func=audit.cmd_audit)
    exp = sub.add_parser("export-log", help="write a day's fire_log as JSON lines or Parquet")
    audit.configure_export(exp)
    exp.set_defaults(func=audit.cmd_export)


def _not_yet(verb: str, what: str) -> Callable[[argparse.Namespace], int]:
    def run(_: argparse.Namespace) -> int:
        print(
            f"scheduler {verb}: {what} is not implemented yet (its issue is still open).",
            file=sys.stderr,
        )
        return 3

    return run


def _settings(args: argparse.Namespace) -> Any:
    from scheduler.settings import load_settings

    overrides = {"data_dir": args.data_dir} if getattr(args, "data_dir", None) else {}
    return load_settings(args.config, **overrides)


def cmd_run(args: argparse.Namespace) -> int:
    settings = _settings(args)
    configure_logging(settings.log_level, settings.log_format)
    from scheduler.daemon import Daemon

    daemon = Daemon(settings, embedded=args.embedded)
    return _run_async(_run_daemon(daemon))


async def _run_daemon(daemon: Any) -> int:
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    signals = {"count": 0}

    def on_signal() -> None:
        signals["count"] += 1
        if signals["count"] == 1:
            daemon.stop()
        elif main_task is not None:  # a second Ctrl-C: stop waiting for a graceful end
            main_task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    loop.add_signal_handler(signal.SIGHUP, daemon.reload)
    runner = asyncio.create_task(daemon.run(), name="daemon")
    started = asyncio.create_task(daemon.started.wait(), name="started")
    await asyncio.wait({runner, started}, return_when=asyncio.FIRST_COMPLETED)
    if started.done() and not runner.done():
        print_banner(daemon)
        from scheduler.daemon import tune_gc

        tune_gc()
    started.cancel()
    await runner
    return 0


def print_banner(daemon: Any) -> None:
    e = daemon.endpoints
    tag = {k: " (embedded)" if k in e.embedded else "" for k in ("nats", "postgres")}
    lines = [
        f"mq-scheduler {__version__} running as {daemon.settings.instance_id}",
        f"  NATS        {e.nats_url}{tag['nats']}",
        f"  PostgreSQL  {e.database_url}{tag['postgres']}",
        f"  API         {e.api.url}  (/healthz, /readyz)",
        f"  metrics     {e.metrics.url}/metrics",
        f"  schedules   {daemon.settings.schedules_dir}",
        "Press Ctrl-C to stop.",
    ]
    print("\n".join(lines), flush=True)


def cmd_migrate(args: argparse.Namespace) -> int:
    settings = _settings(args)
    configure_logging(settings.log_level, settings.log_format)
    from scheduler import migrate
    from scheduler.embedded import Postgres

    pg = None
    dsn = settings.database_dsn
    if dsn is None:
        if not args.embedded:
            raise ConfigError("SCHEDULER_DATABASE_URL", "not set (or pass --embedded)")
        pg = Postgres(settings.data_dir / "postgres").start()
        dsn = pg.url
    try:
        if args.down:
            migrate.downgrade(dsn, args.revision if args.revision != "head" else "base")
        else:
            migrate.upgrade(dsn, args.revision)
    finally:
        if pg is not None:
            pg.stop()
    print(f"migrations {'down' if args.down else 'up'} to {args.revision}: done")
    return 0


def _run_async(coro: Coroutine[Any, Any, int]) -> int:
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "event": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    quiet = max(logging.getLevelName(level), logging.WARNING)
    for noisy in ("nats", "pgserver", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(quiet)
