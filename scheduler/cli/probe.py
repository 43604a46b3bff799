"""`scheduler probe engine`: the engine's liveness for an exec probe (the engine serves no HTTP).

It reads the status the engine writes to `SCHEDULER_RUN_DIR` (`scheduler.daemon.pair`) and
exits 0 while that status is fresh and the engine is starting or running, 1 otherwise, naming
why in one line. A stuck loop stops rewriting the status: the probe then fails, and the
kubelet restarts the engine's container (the edge beside it keeps serving).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scheduler.daemon.pair import read_engine_report

DEFAULT_MAX_AGE = 10.0


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("part", choices=("engine",), help="the role to probe")
    p.add_argument("--run-dir", help="the run folder (default: SCHEDULER_RUN_DIR)")
    p.add_argument(
        "--max-age",
        type=float,
        default=DEFAULT_MAX_AGE,
        help=f"seconds a status may be old and still count (default {DEFAULT_MAX_AGE:g})",
    )


def cmd_probe(args: argparse.Namespace) -> int:
    run_dir = _run_dir(args)
    if run_dir is None:
        print("scheduler probe: no run folder: set SCHEDULER_RUN_DIR or --run-dir", file=sys.stderr)
        return 2
    report = read_engine_report(run_dir)
    if report is None:
        print(f"scheduler probe: {run_dir} holds no report of an engine", file=sys.stderr)
        return 1
    age = report.age()
    if age > args.max_age:
        print(f"scheduler probe: the engine's status is {age:.1f}s old", file=sys.stderr)
        return 1
    if report.nats == "closed":
        print("scheduler probe: the engine's NATS connection is closed for good", file=sys.stderr)
        return 1
    if report.state not in ("starting", "running"):
        print(f"scheduler probe: the engine is {report.state}", file=sys.stderr)
        return 1
    print(f"engine {report.state} as {report.role} (epoch {report.epoch}, {age:.1f}s ago)")
    return 0


def _run_dir(args: argparse.Namespace) -> Path | None:
    if args.run_dir:
        return Path(args.run_dir)
    from scheduler.settings import load_settings

    return load_settings(None).run_dir
