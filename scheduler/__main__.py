from __future__ import annotations

import sys

from scheduler.cli.main import main

sys.exit(main())
