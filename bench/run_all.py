"""Run every benchmark in turn; JSON in bench/results/<name>.json, one summary line each on stderr.

.venv/bin/python bench/run_all.py            # the sizes issue 3 names (~10 min)
.venv/bin/python bench/run_all.py --quick    # small sizes, a smoke test (~2 min)
.venv/bin/python bench/run_all.py --with-3m  # scale also at 3,000,000 pending
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FULL = {
    "broker_at": ["--rate", "5000", "--duration", "10", "--delay", "2"],
    "accuracy": ["--rate", "5000", "--duration", "60", "--delay", "2"],
    "burst": ["--count", "100000"],
    "intake": ["--backlog", "600000", "--live-seconds", "30"],
    "scale": ["--counts", "1000000"],
    "cron": ["--jobs", "200,1000", "--duration", "20"],
}
QUICK = {
    "broker_at": ["--rate", "1000", "--duration", "3"],
    "accuracy": ["--rate", "1000", "--duration", "5"],
    "burst": ["--count", "20000"],
    "intake": ["--backlog", "50000", "--live-seconds", "6"],
    "scale": ["--counts", "100000", "--seconds", "5"],
    "cron": ["--jobs", "20", "--duration", "4"],
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--with-3m", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated subset, e.g. accuracy,burst")
    a = ap.parse_args()
    plan = QUICK if a.quick else FULL
    names = [n for n in plan if not a.only or n in a.only.split(",")]
    failed = []
    for name in names:
        args = plan[name] + (["--with-3m"] if name == "scale" and a.with_3m else [])
        out = HERE / "results" / f"{name}{'-quick' if a.quick else ''}.json"
        cmd = [sys.executable, str(HERE / f"{name}.py"), *args, "--out", str(out)]
        out.unlink(missing_ok=True)
        subprocess.run(cmd, stdout=subprocess.DEVNULL, check=False)
        if not out.is_file() or not json.loads(out.read_text())["pass"]:
            failed.append(name)
    print(
        f"run_all: {len(names) - len(failed)}/{len(names)} passed; not: {failed}", file=sys.stderr
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
