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
import os
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
from scheduler.cli.global_options import hoist
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
`scheduler COMMAND --help` describes a command; its --url, --token, --json, --config and
--data-dir may also come before it (`scheduler --token T delayed list`).
Read more in the README ("Quick start", "Commands", "Configuration") and docs/: producers.md
(publishing delayed tasks), cron.md (cron jobs), operations.md (running it, "Start-up errors"
and exit statuses, metrics), leadership.md (high availability).

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
    args = parser.parse_args(hoist(sys.argv[1:] if argv is None else argv))
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
    except SchedulerError as exc:
        known = error_line(exc)
        assert known is not None
        print(known[1], file=sys.stderr)
        return known[0]
    except KeyboardInterrupt:
        print("scheduler: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


def error_line(exc: BaseException) -> tuple[int, str] | None:
    """The exit status and the one line for an error the CLI reports without a traceback."""
    if isinstance(exc, ConfigError):
        return EXIT_CONFIG, f"scheduler: configuration error: {exc}"
    if isinstance(exc, ServiceUnavailableError):
        return EXIT_UNAVAILABLE, f"scheduler: {exc}"
    if isinstance(exc, SchedulerError):
        return EXIT_FAILED, f"scheduler: {exc}"
    return None


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
    run.add_argument(
        "--role",
        choices=("engine", "edge"),
        help="run one role alone: the engine (leadership, intake, firing, cron; no HTTP) or "
        "the edge (HTTP API, console, metrics, NATS request verbs); default: both, the "
        "engine in this process and the edge in a child process",
    )
    run.add_argument(
        "--engines",
        type=_engine_count,
        default=1,
        metavar="N",
        help="run N engine processes beside the edge (default 1): under SCHEDULER_PARTITIONS "
        "> 1 they share the partitions, under 1 the others stand by",
    )
    run.set_defaults(func=cmd_run)

    mig = sub.add_parser("migrate", help="bring the PostgreSQL schema up to date (idempotent)")
    _common(mig)
    mig.add_argument("--revision", default="head", help="target revision (default: head)")
    mig.add_argument("--down", action="store_true", help="downgrade to --revision instead")
    mig.add_argument("--embedded", action="store_true", help="migrate the embedded PostgreSQL")
    mig.set_defaults(func=cmd_migrate)

    from scheduler.cli import probe

    prb = sub.add_parser("probe", help="the engine's liveness, for an exec probe")
    probe.configure(prb)
    prb.set_defaults(func=probe.cmd_probe)

    _schedule_commands(sub)
    _audit_commands(sub)
    from scheduler.cli import ops

    ops.register(sub)  # status, schedules, delayed, dlq: the management API's CLI
    from scheduler.cli import provision

    prov = sub.add_parser("provision", help="create the NATS streams and buckets; --replicas N")
    provision.configure(prov)
    prov.set_defaults(func=provision.cmd_provision)
    from scheduler.cli import partitions

    partitions.register(sub)  # partitions set: a new partition count, engines stopped
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


def _engine_count(value: str) -> int:
    from scheduler.daemon.crew import MAX_ENGINES

    try:
        count = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not 1 <= count <= MAX_ENGINES:
        raise argparse.ArgumentTypeError(f"must be 1..{MAX_ENGINES}, got {count}")
    return count


def cmd_run(args: argparse.Namespace) -> int:
    if args.role is not None and args.engines != 1:
        print("scheduler: --engines runs engines beside an edge: not with --role", file=sys.stderr)
        return 2
    settings = _settings(args)
    configure_logging(settings.log_level, settings.log_format)
    if args.role == "edge":
        return _run_edge(settings, args)
    tokens = None
    if args.embedded and args.role is None:  # dev mode: the CLI and the console just work
        from scheduler.daemon.embedded import with_dev_tokens

        settings, tokens = with_dev_tokens(settings)
    daemon: Any
    if args.role == "engine":
        from scheduler.daemon import supervisor
        from scheduler.daemon.engine import EngineDaemon

        parent = supervisor.paired_parent()  # engine 2..N of `scheduler run --engines N`
        if parent is not None:
            supervisor.die_with_parent(parent)

        daemon = EngineDaemon(settings, embedded=args.embedded, run_dir=settings.run_dir)
        code = _run_async(_run_daemon(daemon, banner=False))
    else:
        from scheduler.daemon.supervisor import EdgeFailed, Pair

        daemon = Pair(settings, embedded=args.embedded, argv=_passed_on(args), engines=args.engines)
        try:
            code = _run_async(_run_daemon(daemon, tokens))
        except EdgeFailed as exc:  # the edge's own one line, printed once, after it exited
            print(exc.line, file=sys.stderr)
            return exc.code
    if daemon.stopped_during_start is not None:
        print(
            f"scheduler: stopped during start-up (while {daemon.stopped_during_start})",
            file=sys.stderr,
        )
    return code


def _passed_on(args: argparse.Namespace) -> list[str]:
    """The options of `scheduler run` its edge child takes too."""
    words = []
    if args.config:
        words += ["--config", args.config]
    if args.data_dir:
        words += ["--data-dir", args.data_dir]
    return words


def _run_edge(settings: Any, args: argparse.Namespace) -> int:
    """`scheduler run --role edge`: alone, or as the child of `scheduler run`, which then
    prints this process's one-line error (`scheduler.daemon.supervisor`)."""
    from scheduler.daemon import supervisor
    from scheduler.daemon.edge import EdgeDaemon, FolderEngine

    parent = supervisor.paired_parent()
    if parent is not None:
        supervisor.die_with_parent(parent)
    # Below the engine's CPU priority: on a host where both wait for a core (an edge busy
    # with a crowd of clients), the engine's timers run first.
    os.nice(settings.edge_nice)
    run_dir = settings.run_dir
    edge = EdgeDaemon(
        settings,
        FolderEngine(run_dir) if run_dir is not None else None,
        embedded=args.embedded,
        announce=lambda e: supervisor.report_listening(run_dir, e),
    )
    if parent is None:
        code = _run_async(_run_daemon(edge, banner=False))
        if edge.stopped_during_start is not None:
            print(
                f"scheduler: stopped during start-up (while {edge.stopped_during_start})",
                file=sys.stderr,
            )
        return code
    try:
        return _run_async(_run_daemon(edge, banner=False))
    except KeyboardInterrupt:  # SIGTERM from `scheduler run` before the loop took signals
        return EXIT_INTERRUPTED
    except Exception as exc:
        known = error_line(exc)
        if known is None:
            raise
        supervisor.report_exit(run_dir, *known)
        return known[0]


async def _run_daemon(daemon: Any, tokens: DevAccess | None = None, banner: bool = True) -> int:
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
    if hasattr(daemon, "reload"):
        loop.add_signal_handler(signal.SIGHUP, daemon.reload)
    runner = asyncio.create_task(daemon.run(), name="daemon")
    started = asyncio.create_task(daemon.started.wait(), name="started")
    try:
        await asyncio.wait({runner, started}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the second signal during start-up
        started.cancel()
        runner.cancel()
        await asyncio.gather(runner, started, return_exceptions=True)
        print("scheduler: stopped at once (second signal)", file=sys.stderr)
        return EXIT_INTERRUPTED
    if started.done() and not runner.done():
        if banner:
            access = None
            if daemon.embedded:
                from scheduler.daemon.embedded import publish_dev_access

                url = daemon.endpoints.api.url
                access = publish_dev_access(daemon.settings.data_dir, url, tokens)
            print_banner(daemon, tokens, access)
        from scheduler.daemon.runstate import tune_gc

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
    crew = getattr(daemon, "crew", None)
    if crew is not None:
        lines.insert(1, f"  engines     {crew.count}: this process and {crew.count - 1} beside it")
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
    # httpx logs every request at INFO: the console's calls to the API, one line each
    for noisy in ("nats", "pgserver", "uvicorn", "alembic.runtime.plugins", "httpx"):
        logging.getLogger(noisy).setLevel(quiet)
