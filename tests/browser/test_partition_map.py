"""The console's overview under P > 1: the partition map (each engine's share, the partitions
without an owner flagged), at 1,280 and 390 px."""

from __future__ import annotations

import asyncio
import re

from playwright.async_api import expect

from scheduler.leadership.partitioned import PartitionedLeadership
from tests.browser.conftest import Console, shot
from tests.browser.test_pages import AUDIT_JS
from tests.support.partitioned import partitioned_pool

P = 4


async def test_the_overview_shows_the_partition_map_and_flags_partitions_nobody_holds(
    console: Console, database_url: str
) -> None:
    """One engine over P = 4 holds every partition: the overview's card says 4 of 4 held by
    one engine, the parts' card 4 of 4 leases, and the map's row names it with 0-3; once it
    gives every partition back and takes none again, the cards and a `no owner` row flag all
    four; no leader card either way."""
    pool = await partitioned_pool(database_url, P)
    await pool.close()
    await console.api.start(partitions=P)
    daemon = console.api.daemon
    assert daemon is not None and isinstance(daemon.leadership, PartitionedLeadership)
    page = await console.signed_in()
    card, table = page.get_by_test_id("partitions-card"), page.get_by_test_id("partition-map")
    for _ in range(50):  # the engine takes its partitions within a campaign or two
        if await table.get_by_role("row").filter(has_text="test-1").count():
            break
        await page.reload()
    await expect(card).to_contain_text("4 of 4 held")
    await expect(card).to_contain_text("by 1 engine")
    row = table.get_by_role("row").filter(has_text="test-1")
    await expect(row).to_contain_text("4")
    await expect(row).to_contain_text("0-3")
    await expect(page.get_by_role("heading", name="Leader")).to_have_count(0)
    await expect(page.get_by_test_id("unowned")).to_have_count(0)
    await expect(page.get_by_test_id("health")).to_contain_text(re.compile(r"Leases\s*4 of 4 held"))
    for width in (1280, 390):
        await page.set_viewport_size({"width": width, "height": 900})
        assert await page.evaluate(AUDIT_JS) == []
        await shot(page, "partition-map")

    await daemon.leadership.resign()  # every key given back, none taken again
    unowned = page.get_by_test_id("unowned")
    for _ in range(50):  # a map read while the keys went one by one shows some still held
        await page.reload()
        if await unowned.count() and "0-3" in await unowned.inner_text():
            break
        await asyncio.sleep(0.1)
    await expect(unowned).to_contain_text("no owner")
    await expect(unowned).to_contain_text("0-3")
    await expect(card).to_contain_text("0 of 4 held")
    await expect(card).to_contain_text("4 without an owner")
    await expect(page.get_by_test_id("health")).to_contain_text(re.compile(r"Leases\s*0 of 4 held"))
