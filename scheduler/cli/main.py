"""The `scheduler` command line. Only this module configures logging.

Exit statuses, one list for every verb (README "Commands", docs/operations.md "Start-up
errors"): 0 done, or stopped by a signal; 1 failed (an operator verb: refused or not found;
`status`: errors in the schedules YAML); 2 a setting or an argument is wrong; 3 an operator
verb (`status`, `schedules`, `delayed`, `dlq`, `activity`) got no answer from mq-scheduler's
management API (unreachable, another program answering, or a 5xx); 4 NATS or PostgreSQL
unreachable for SCHEDULER_STARTUP_TIMEOUT; 130 interrupted; 141 stdout closed early (a pipe
such as `scheduler dlq list | head`: SIGPIPE's status).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import shlex
import shutil
import signal
import sys
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scheduler import __version__
from scheduler.cli.apiclient import URL_ENV
from scheduler.errors import ConfigError, SchedulerError, ServiceUnavailableError

if TYPE_CHECKING:
    from scheduler.daemon.dev_access import DevAccess

EXIT_FAILED, EXIT_CONFIG, EXIT_UNAVAILABLE, EXIT_INTERRUPTED = 1, 2, 4, 130

DESCRIPTION = """\
mq-scheduler: the cron-style scheduler and delayed-delivery timer of a NATS JetStream task
queue. Producers publish tasks with a delay_until to the delay lane (mq.delay.<rest>); the
daemon keeps them in PostgreSQL and publishes each one to mq.<rest> when it falls due. Cron
jobs come from scheduled_jobs YAML files. Several instances run as one leader and standbys.
"""

EPILOG = """\
Try it: `scheduler run --embedded` starts a local nats-server and PostgreSQL (scripts/dev
does this from a checkout); the operator verbs then find it by themselves from the same folder
(.scheduler-data/api.json). Settings are SCHEDULER_* environment variables or --config FILE.
`scheduler COMMAND --help` describes a command. Read more in the README ("Quick start",
"Commands", "Configuration") and docs/: producers.md (publishing delayed tasks), cron.md (cron
jobs), operations.md (running it, "Start-up errors" and exit statuses, metrics),
leadership.md (high availability).

Exit status: 0 done or stopped by a signal; 1 failed (operator verbs: refused or not found);
2 a setting or an argument is wrong (the message names it); 3 the management API could not be
reached, was not mq-scheduler's, or failed (operator verbs); 4 NATS or PostgreSQL unreachable
for SCHEDULER_STARTUP_TIMEOUT; 130 interrupted; 141 output cut short (`... | head`).
`scheduler status` exits 1 while the schedules YAML has errors.
"""


def console_main() -> int:
    """The `scheduler` command and `python -m scheduler`: `main`, then a quick exit. The
    interpreter's last garbage collection at exit walks every object the imported modules
    made (the API, SQLAlchemy, Alembic): 0.9 s on a 2-core host, after everything had already
    stopped. Frozen, they are left to the end of the process; nothing runs after this but
    the interpreter's own teardown (the daemon has closed what it opened)."""
    try:
        return main()
    finally:  # argparse's --help and --version leave by SystemExit
        gc.freeze()


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    # Until a command's event loop takes the signals over, SIGTERM stops like Ctrl-C does
    # (signal handlers belong to the main thread; a caller running main() in another thread
    # keeps its own).
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler) if in_main else None
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # inside the try: a reader gone early is found here, not at exit
        return code
    except BrokenPipeError:  # `scheduler dlq list | head`: stop quietly
        from scheduler.cli.apiclient import stdout_closed

        return stdout_closed()
    except ConfigError as exc:
        print(f"scheduler: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except ServiceUnavailableError as exc:
        print(f"scheduler: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except SchedulerError as exc:
        print(f"scheduler: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("scheduler: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scheduler",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    from scheduler.cli import ops

    ops.register(sub)  # status, schedules, delayed, dlq: the management API's CLI
    from scheduler.cli import provision

    prov = sub.add_parser("provision", help="create the NATS streams and buckets; --replicas N")
    provision.configure(prov)
    prov.set_defaults(func=provision.cmd_provision)
    return parser


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config file (keys as the SCHEDULER_* variables)")
    p.add_argument("--data-dir", help="data dir of embedded servers (default .scheduler-data)")


def _schedule_commands(sub: Any) -> None:
    from scheduler.cli import cron_yaml

    val = sub.add_parser("validate", help="lint scheduled_jobs YAML files")
    cron_yaml.configure_validate(val)
    val.set_defaults(func=cron_yaml.cmd_validate)
    nxt = sub.add_parser("next", help="print the coming occurrences of cron jobs")
    cron_yaml.configure_next(nxt)
    nxt.set_defaults(func=cron_yaml.cmd_next)


def _audit_commands(sub: Any) -> None:
    from scheduler.audit import cli as audit  # PySpark is imported only when the audit runs

    aud = sub.add_parser("audit", help="the PySpark drift audit of a day's execution log")
    audit.configure_audit(aud)
    aud.set_defaults(func=audit.cmd_audit)
    exp = sub.add_parser("export-log", help="write a day's fire_log as JSON lines or Parquet")
    audit.configure_export(exp)
    exp.set_defaults(func=audit.cmd_export)


def _settings(args: argparse.Namespace) -> Any:
    from scheduler.settings import load_settings

    overrides = {"data_dir": args.data_dir} if getattr(args, "data_dir", None) else {}
    return load_settings(args.config, **overrides)


def cmd_run(args: argparse.Namespace) -> int:
    settings = _settings(args)
    configure_logging(settings.log_level, settings.log_format)
    from scheduler.daemon.lifecycle import Daemon

    tokens = None
    if args.embedded:  # dev mode: the CLI and the console work without setting anything
        from scheduler.daemon.embedded import with_dev_tokens

        settings, tokens = with_dev_tokens(settings)
    daemon = Daemon(settings, embedded=args.embedded)
    code = _run_async(_run_daemon(daemon, tokens))
    if daemon.stopped_during_start is not None:
        print(
            f"scheduler: stopped during start-up (while {daemon.stopped_during_start})",
            file=sys.stderr,
        )
    return code


async def _run_daemon(daemon: Any, tokens: DevAccess | None = None) -> int:
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
        access = None
        if daemon.embedded:
            from scheduler.daemon.embedded import publish_dev_access

            access = publish_dev_access(daemon.settings.data_dir, daemon.endpoints.api.url, tokens)
        print_banner(daemon, tokens, access)
        from scheduler.daemon.lifecycle import tune_gc

        tune_gc()
    started.cancel()
    try:
        await runner
    except asyncio.CancelledError:  # the second signal: cleanup was cut short
        print("scheduler: stopped at once (second signal)", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def print_banner(
    daemon: Any, tokens: DevAccess | None = None, access_file: Path | None = None
) -> None:
    """Where everything listens, how to sign in to the console, and one `export` line for
    another shell: `scheduler` on PATH, the API's URL (and the dev admin token), NATS_URL
    (the docs' examples and the `nats` CLI read it)."""
    e = daemon.endpoints
    tag = {k: " (embedded)" if k in e.embedded else "" for k in ("nats", "postgres")}
    lines = [
        f"mq-scheduler {__version__} running as {daemon.settings.instance_id}",
        f"  NATS        {e.nats_url}{tag['nats']}",
        f"  PostgreSQL  {e.database_url}{tag['postgres']}",
        f"  API         {e.api.url}  (/healthz, /readyz, /v1/leader; reference at /docs)",
        f"  console     {e.api.url}/ui/  ({_sign_in(daemon.settings, tokens)})",
        f"  metrics     {e.metrics.url}/metrics",
        f"  schedules   {daemon.settings.schedules_dir}",
        "  delay lane  publish to mq.delay.<rest>: delivered to mq.<rest> (docs/producers.md)",
    ]
    if access_file is not None:
        lines.append(
            f"`scheduler` run from this folder finds this daemon by itself ({access_file}); "
            "elsewhere, and for producers and the examples in docs/, in another shell:"
        )
    else:
        lines.append("For the CLI, producers and the examples in docs/, in another shell:")
    lines += ["  export " + " ".join(_exports(e, tokens)), "Press Ctrl-C to stop."]
    print("\n".join(lines), flush=True)


def _sign_in(settings: Any, tokens: DevAccess | None) -> str:
    if tokens is not None:
        return "sign in with SCHEDULER_ADMIN_TOKEN below; it stays the same for this data dir"
    if settings.admin_token is None and settings.read_token is None:
        return "open for reading: no token is set"
    return "sign in with SCHEDULER_ADMIN_TOKEN or SCHEDULER_READ_TOKEN"


def _exports(endpoints: Any, tokens: DevAccess | None) -> list[str]:
    """NAME=value words for the banner's `export` line, quoted for a POSIX shell."""
    words = []
    venv_bin = Path(sys.executable).parent
    on_path = shutil.which("scheduler")
    if (venv_bin / "scheduler").exists() and (on_path is None or Path(on_path).parent != venv_bin):
        words.append(f'PATH={shlex.quote(str(venv_bin))}:"$PATH"')
    words.append(f"{URL_ENV}={shlex.quote(endpoints.api.url)}")
    if tokens is not None and tokens.admin_token is not None:
        words.append(f"SCHEDULER_ADMIN_TOKEN={shlex.quote(tokens.admin_token)}")
    words.append(f"NATS_URL={shlex.quote(endpoints.nats_url)}")
    return words


def cmd_migrate(args: argparse.Namespace) -> int:
    settings = _settings(args)
    configure_logging(settings.log_level, settings.log_format)
    return _run_async(_migrate(settings, args))


async def _migrate(settings: Any, args: argparse.Namespace) -> int:
    """`scheduler migrate`; SIGTERM or Ctrl-C cancels it at any point (status 130)."""
    from scheduler.daemon import migrate
    from scheduler.daemon.embedded import Postgres

    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, task.cancel)
    budget = settings.startup_timeout.total_seconds()
    pg = None
    try:
        dsn = settings.database_dsn
        if dsn is None:
            if not args.embedded:
                raise ConfigError("SCHEDULER_DATABASE_URL", "not set (or pass --embedded)")
            pg = Postgres(settings.data_dir / "postgres")
            await pg.start_async()
            dsn = pg.url
        target = args.revision
        if args.down:
            target = target if target != "head" else "base"
            await migrate.downgrade_async(dsn, target, budget)
        else:
            await migrate.upgrade_async(dsn, target, budget)
    except asyncio.CancelledError:
        print(
            "scheduler: migrate stopped by a signal; the schema is at the last migration that "
            "completed (run it again)",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    finally:
        if pg is not None:
            pg.stop()
    print(f"migrations {'down' if args.down else 'up'} to {target}: done")
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
    for noisy in ("nats", "pgserver", "uvicorn", "alembic.runtime.plugins"):
        logging.getLogger(noisy).setLevel(quiet)
