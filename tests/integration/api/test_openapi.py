"""A schemathesis run against the running daemon's /openapi.json (bounded examples) finds no
server error and no response that breaks the document. That the document is generated from the
models is checked on the twins (tests/unit/test_api_document.py)."""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.integration.api.harness import ADMIN, READ, TARGET, ApiHarness, envelope, poll
from tests.support.compat import CURRENT, Servers

CONFIG = Path(__file__).with_name("schemathesis.toml")
MAX_EXAMPLES = 15  # per operation and phase: the whole run stays under a minute here
# On production's server versions (the `[compat]` run) a smaller sample shows whether the
# queries behave on PostgreSQL 15 and nats-server 2.10; the document itself does not change.
COMPAT_EXAMPLES = 5


async def test_schemathesis_finds_no_server_error_and_no_schema_violation(
    api: ApiHarness, tmp_path: Path, servers: Servers
) -> None:
    """Every operation, fuzzed with bounded examples and followed through its links, answers
    within its documented statuses, content types and schemas, and never with a 5xx."""
    await api.start(max_attempts=1)
    now = datetime.now(UTC)
    for i in range(3):
        await api.publish(TARGET, envelope(now + timedelta(days=1, minutes=i), org_id="org-1"))
        await api.publish("mq.nowhere.x", envelope(None))
    await api.js.publish("mq.delay.tasks.work", b"{broken")

    async def dead() -> int:
        r = await api.call("GET", "/v1/dead-letters", token=READ)
        return len(r.body["items"])

    await poll(dead, lambda n: n == 4, within=10)
    await api.publish(TARGET, envelope(now + timedelta(milliseconds=100)))  # lists fired ones too

    async def fired() -> int:
        r = await api.call("GET", "/v1/delayed", token=READ, params={"status": "fired"})
        return len(r.body["items"])

    await poll(fired, lambda n: n == 1, within=10)
    st = Path(sys.executable).with_name("st")
    proc = await asyncio.create_subprocess_exec(
        str(st),
        "--config-file",
        str(CONFIG),
        "run",
        f"{api.url}/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        str(MAX_EXAMPLES if servers is CURRENT else COMPAT_EXAMPLES),
        "--seed",
        "20261125",
        "--workers",
        "1",
        "--request-timeout",
        "10",
        "--header",
        f"Authorization: Bearer {ADMIN}",
        "--no-color",
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=240)
    report = out.decode(errors="replace")
    assert proc.returncode == 0, report[-6000:]
    assert "Server error" not in report
