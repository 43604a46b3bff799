from __future__ import annotations

import sys

from scheduler.cli.main import console_main

sys.exit(console_main())
