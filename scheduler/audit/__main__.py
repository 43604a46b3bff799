"""`python -m scheduler.audit ...` or `spark-submit <this file> ...`: the audit's entry point."""

from __future__ import annotations

import sys
from pathlib import Path

# spark-submit puts this file's folder first on sys.path; its module names must not shadow others
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

from scheduler.audit.cli import audit_main

if __name__ == "__main__":
    sys.exit(audit_main())
