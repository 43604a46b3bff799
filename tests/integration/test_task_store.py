"""TaskStore against real PostgreSQL: statistics after a burst, booking, races, HOT claims."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from scheduler.metrics import Metrics
from scheduler.records import Fired, NewTask
from scheduler.store.postgres import epoch as epoch_module
from scheduler.store.postgres import tasks as tasks_module
from scheduler.store.postgres.connect import PostgresStore, create_pool
from scheduler.store.postgres.epoch import take_office
from scheduler.store.postgres.tasks import FIRED_CHUNK, TaskStore
from tests.support.helpers import waiting_on_locks
from tests.support.stores import claim, insert


def batch(n: int, due: datetime) -> list[NewTask]:
    return [
        NewTask(f"t_{uuid.uuid4().hex}", "mq.tasks.x", b"{}", {}, 5, due, due, None)
        for _ in range(n)
    ]


async def test_analyze_runs_once_enough_rows_arrived(database_url: str) -> None:
    """A table filled by a burst is analyzed once (row estimate from 0 to the real count), not
    again until it has grown by half; a redelivered batch stored nothing and counts nothing."""
    pool = await create_pool(database_url, min_size=1, max_size=2)
    tasks = TaskStore(PostgresStore(pool, Metrics()))
    due = datetime.now(UTC) + timedelta(hours=1)
    try:

        async def estimate() -> int:
            return int(
                await pool.fetchval(
                    "SELECT reltuples FROM pg_class WHERE oid = 'delayed_messages'::regclass"
                )
            )

        assert await tasks.analyze_if_stale(min_rows=100) is False  # nothing inserted yet
        first = batch(300, due)
        await insert(tasks, first)
        assert await insert(tasks, first) == []  # stored once, not counted twice
        assert tasks.inserted == 300
        assert await estimate() <= 0  # never analyzed: the planner thinks the table is empty
        assert await tasks.analyze_if_stale(min_rows=100) is True
        assert await estimate() == 300
        assert await tasks.analyze_if_stale(min_rows=100) is False  # nothing new since
        await insert(tasks, batch(120, due))  # grown by less than half of 300
        assert await tasks.analyze_if_stale(min_rows=100) is False
        await insert(tasks, batch(40, due))  # 160 new rows: more than half
        assert await tasks.analyze_if_stale(min_rows=100) is True
        assert await estimate() == 460
    finally:
        await pool.close()


async def test_mark_fired_records_exact_instants_whatever_the_ids(database_url: str) -> None:
    """Booking passes ids, subjects and streams joined into one string and instants as integer
    microseconds; an id the separator cannot carry (or an empty one) takes plain arrays. Both
    record status, stream sequence and the fire log to the microsecond."""
    from scheduler.records import Fired
    from scheduler.store.postgres.epoch import take_office

    pool = await create_pool(database_url, min_size=1, max_size=2)
    tasks = TaskStore(PostgresStore(pool, Metrics()))
    try:
        epoch = await take_office(pool, "t")
        due = datetime(2026, 11, 24, 3, 0, 0, 123457, tzinfo=UTC)  # odd microseconds
        plain = batch(3, due)
        odd = batch(2, due)
        odd[0].id = "odd\x1fid"
        expires = due + timedelta(hours=1, microseconds=3)
        plain[1].expires_at = odd[1].expires_at = expires
        for group in (plain, odd):
            await insert(tasks, group)
            claimed = await claim(tasks, epoch, [t.id for t in group], due)
            assert len(claimed) == len(group)
            assert [t.expires_at for t in claimed] == [t.expires_at for t in group]
            fired_at = due + timedelta(microseconds=999)
            await tasks.mark_fired(
                epoch,
                [Fired(t, fired_at, "TASKS", 40 + i) for i, t in enumerate(claimed)],
                "t",
            )
        assert await pool.fetchval("SELECT count(*) FROM delayed_messages") == 0  # deleted
        rows = await pool.fetch(
            "SELECT d.id, 'fired' AS status, f.stream_seq, d.fired_at, f.key, f.subject, "
            "f.stream, f.scheduled_for, f.fired_at AS logged_at FROM fired_tasks d "
            "JOIN fire_log f ON f.key = d.id"
        )
        assert {r["id"] for r in rows} == {t.id for t in plain + odd}
        for r in rows:
            assert r["status"] == "fired" and r["key"] == r["id"]
            assert r["subject"] == "mq.tasks.x" and r["stream"] == "TASKS"
            assert r["scheduled_for"] == due
            assert r["fired_at"] == r["logged_at"] == due + timedelta(microseconds=999)
            assert r["stream_seq"] >= 40
    finally:
        await pool.close()


async def test_a_resend_inserted_while_its_task_is_booked_fired_is_refused(
    database_url: str,
) -> None:
    """A resend of a task whose `mark_fired` has deleted the row but not committed yet is
    refused: the insert still sees the task and skips it without a lock or a wait (migration
    0021; before it, the insert waited on the deleted row, then found no conflict, and the
    tombstone check after it, a second statement inside the volatile
    `scheduler_intake_insert` with a snapshot of its own, refused it). Either way the id is
    neither stored nor claimable once the booking commits, and is `resent`."""
    pool = await create_pool(database_url, min_size=1, max_size=4)
    tasks = TaskStore(PostgresStore(pool, Metrics()))
    blocker = await asyncpg.connect(database_url)
    try:
        epoch = await take_office(pool, "t")
        due = datetime.now(UTC) - timedelta(seconds=1)
        (task,) = batch(1, due)
        await insert(tasks, [task])
        (claimed,) = await claim(tasks, epoch, [task.id], due)

        # An uncommitted tombstone holds mark_fired after its DELETE, before its commit.
        lock = blocker.transaction()
        await lock.start()
        await blocker.execute(
            "INSERT INTO fired_tasks VALUES ($1, 'x', md5('')::uuid, now())", task.id
        )
        booking = asyncio.create_task(
            tasks.mark_fired(epoch, [Fired(claimed, datetime.now(UTC), "S", 1)], "t")
        )
        await waiting_on_locks(pool, 1)  # counted on the pool, not `blocker`
        async with asyncio.timeout(3):  # no wait on the deleted row
            got = await tasks.insert_batch([task])
        assert (got.stored, got.resent, got.taken) == ([], [task], [])
        await lock.rollback()
        await booking
        assert await pool.fetchval("SELECT count(*) FROM delayed_messages") == 0
        assert await pool.fetchval("SELECT target FROM fired_tasks") == "mq.tasks.x"
    finally:
        await blocker.close()
        await pool.close()


async def test_a_claim_is_a_heap_only_tuple_update(database_url: str) -> None:
    """Claiming tasks changes no indexed column (migration 0013: the status stays, the claim is
    `claimed_epoch`), so each claimed row is updated in place on its page at fillfactor 45:
    as many HOT updates as tasks claimed, and no index grows. The claimed tasks still read
    `claimed`."""
    from scheduler.store.postgres.epoch import take_office

    pool = await create_pool(database_url, min_size=1, max_size=1)  # one backend: its stats
    tasks = TaskStore(PostgresStore(pool, Metrics()))
    try:
        options = await pool.fetchval(
            "SELECT reloptions FROM pg_class WHERE oid = 'delayed_messages'::regclass"
        )
        assert options == ["fillfactor=45"]
        epoch = await take_office(pool, "t")
        due = datetime.now(UTC) - timedelta(seconds=1)
        group = [
            NewTask(f"h_{uuid.uuid4().hex}", "mq.tasks.x", b"x" * 200, {}, 5, due, due, None)
            for _ in range(500)
        ]
        await insert(tasks, group)

        async def updates() -> tuple[int, int, int]:
            await pool.execute("SELECT pg_stat_force_next_flush()")  # flushed before it returns
            row = await pool.fetchrow(
                "SELECT n_tup_upd, n_tup_hot_upd, (SELECT sum(pg_relation_size(indexrelid)) "
                "FROM pg_index WHERE indrelid = relid) AS indexes FROM pg_stat_user_tables "
                "WHERE relname = 'delayed_messages'"
            )
            assert row is not None
            return int(row["n_tup_upd"]), int(row["n_tup_hot_upd"]), int(row["indexes"])

        before = await updates()
        claimed = await claim(tasks, epoch, [t.id for t in group], due)
        after = await updates()
        assert len(claimed) == len(group)
        assert (after[0] - before[0], after[1] - before[1]) == (len(group), len(group))
        assert after[2] == before[2]  # no index entry added
        assert (await tasks.get(group[0].id) or {})["status"] == "claimed"
        assert await tasks.pending_count() == 0
    finally:
        await pool.close()


async def test_a_cancel_racing_a_claim_on_the_same_row(database_url: str) -> None:
    """A claim and a cancel (and a reschedule) wait on the same row: when the claim commits
    first, the cancel re-checks its condition on the claimed row (same status, `claimed_epoch`
    now set) and answers `too_late`, the reschedule too; when the cancel commits first, the
    claim skips the cancelled task. A `cancelled` answer is never for a claimed task."""
    from scheduler.store.postgres.epoch import take_office

    pool = await create_pool(database_url, min_size=1, max_size=4)
    tasks = TaskStore(PostgresStore(pool, Metrics()))
    blocker = await asyncpg.connect(database_url)
    try:
        epoch = await take_office(pool, "t")
        due = datetime.now(UTC) - timedelta(seconds=1)
        first, second = batch(2, due)
        await insert(tasks, [first, second])

        async def held(task: NewTask, *steps: Coroutine[Any, Any, object]) -> list[object]:
            """Run `steps` (coroutines) one after another into the queue of the row's lock,
            then release it; their results in that order."""
            lock = blocker.transaction()
            await lock.start()
            await blocker.execute(
                "SELECT 1 FROM delayed_messages WHERE id = $1 FOR UPDATE", task.id
            )
            running: list[asyncio.Task[object]] = []
            for n, step in enumerate(steps, 1):
                running.append(asyncio.create_task(step))
                await waiting_on_locks(pool, n)
            await lock.rollback()
            return list(await asyncio.gather(*running))

        later = datetime.now(UTC) + timedelta(minutes=5)
        claimed, cancel, moved = await held(
            first,
            claim(tasks, epoch, [first.id], due),
            tasks.cancel(first.id, first.target),
            tasks.reschedule(first.id, first.target, later),
        )
        assert [t.id for t in claimed] == [first.id]  # type: ignore[attr-defined]
        assert (cancel, moved) == ("too_late", ("too_late", None))
        assert (await tasks.get(first.id) or {})["status"] == "claimed"
        cancel, claimed = await held(
            second, tasks.cancel(second.id, second.target), claim(tasks, epoch, [second.id], due)
        )
        assert (cancel, claimed) == ("cancelled", [])
        assert (await tasks.get(second.id) or {})["status"] == "cancelled"
    finally:
        await blocker.close()
        await pool.close()


async def test_listings_and_counts_report_claimed_tasks_as_before(database_url: str) -> None:
    """A claimed task keeps its ready status in its row (migration 0013), yet the listing, its
    status filter, the task detail, the forecast and the counts report it as before: `claimed`
    (also once in doubt), never among the pending or in-doubt ones, still unfinished for its
    organisation."""
    from scheduler.operations.stores import TaskFilter
    from scheduler.records import ClaimedTask
    from scheduler.store.postgres.epoch import take_office
    from scheduler.store.postgres.overview import OverviewStore

    pool = await create_pool(database_url, min_size=1, max_size=2)
    db = PostgresStore(pool, Metrics())
    tasks, overview = TaskStore(db), OverviewStore(db)
    try:
        epoch = await take_office(pool, "t")
        now = datetime.now(UTC)
        due = now - timedelta(seconds=1)
        pending, claimed, doubt, doubted_claim = batch(4, due)
        await insert(tasks, [pending, claimed, doubt, doubted_claim])
        ids = [claimed.id, doubt.id, doubted_claim.id]
        taken = {c.id: c for c in await claim(tasks, epoch, ids, due)}
        retry: list[tuple[ClaimedTask, datetime, str, bool]] = [
            (taken[i], due, "ack lost", True) for i in (doubt.id, doubted_claim.id)
        ]
        await tasks.retry_later(epoch, retry)  # both in doubt, no longer claimed
        again = await claim(tasks, epoch, [doubted_claim.id], due)  # republished: claimed
        assert [c.doubted for c in again] == [True]
        assert await tasks.cancel(doubted_claim.id, doubted_claim.target) == "in_flight"

        async def listed(status: str | None) -> dict[str, str]:
            rows = [
                json.loads(r.doc) for r in await overview.tasks(TaskFilter(status=status), None, 10)
            ]
            return {r["id"]: r["status"] for r in rows}

        assert await listed(None) == {
            pending.id: "pending",
            claimed.id: "claimed",
            doubt.id: "in_doubt",
            doubted_claim.id: "claimed",
        }
        assert await listed("claimed") == {claimed.id: "claimed", doubted_claim.id: "claimed"}
        assert await listed("pending") == {pending.id: "pending"}
        assert await listed("in_doubt") == {doubt.id: "in_doubt"}
        detail = await overview.task(claimed.id)
        assert detail is not None and (detail["status"], detail["claimed_epoch"]) == (
            "claimed",
            epoch,
        )
        assert (await overview.forecast(now))["mq.tasks.x"][0] == 1  # the pending one only
        assert await overview.pending_by_subject(5) == (1, [("mq.tasks.x", 1)])
        assert await tasks.pending_count() == 2  # pending and in doubt, not the claimed ones
        assert await tasks.pending_by_org() == {None: 4}
    finally:
        await pool.close()


async def test_a_replayed_dead_letter_is_pending_again_under_its_organisation(
    database_url: str,
) -> None:
    """Replaying a firing dead letter makes its task pending and unclaimed again, and the heap
    ref the leader is told about names the task's organisation (fair firing queues by it)."""
    from scheduler.store.postgres.dead_letters import DeadLetterStore
    from scheduler.store.postgres.epoch import take_office

    pool = await create_pool(database_url, min_size=1, max_size=2)
    db = PostgresStore(pool, Metrics())
    tasks = TaskStore(db)
    try:
        epoch = await take_office(pool, "t")
        now = datetime.now(UTC)
        (task,) = batch(1, now)
        task.org_id = "acme"
        await insert(tasks, [task])
        (claimed,) = await claim(tasks, epoch, [task.id], now + timedelta(seconds=1))
        await tasks.kill(epoch, [(claimed, "no stream captures mq.tasks.x", "no_stream")])
        dead_id = await pool.fetchval("SELECT id FROM dead_letters WHERE original_id = $1", task.id)
        done = await DeadLetterStore(db).requeue(dead_id, task.id, now, "tester")
        assert done.status == "replayed" and done.ref is not None
        assert (done.ref.task_id, done.ref.org) == (task.id, "acme")
        assert (await tasks.get(task.id) or {})["status"] == "pending"
        assert await tasks.load_page((-1, 0, 0), now + timedelta(seconds=1), 10) == [done.ref]
    finally:
        await pool.close()


async def test_a_burst_is_booked_in_statements_of_at_most_fired_chunk(database_url: str) -> None:
    """A flush of 12,000 deliveries goes to PostgreSQL as statements of at most FIRED_CHUNK
    (one statement of 20,000 once ran on a generic plan that did not finish in 30 s, see
    `FIRED_CHUNK`), and every task is booked once, with its log row."""
    pool = await create_pool(database_url, min_size=1, max_size=1)
    tasks = TaskStore(PostgresStore(pool, Metrics()))
    due = datetime.now(UTC) - timedelta(seconds=1)
    sizes: list[int] = []
    real = tasks._mark_fired

    async def counted(epoch: int, fired: Sequence[Fired], instance: str) -> None:
        sizes.append(len(fired))
        await real(epoch, fired, instance)

    tasks._mark_fired = counted  # type: ignore[method-assign]
    try:
        epoch = await take_office(pool, "test")
        group = batch(12_000, due)
        claimed = []
        for start in range(0, len(group), 4_000):
            await insert(tasks, group[start : start + 4_000])
            ids = [t.id for t in group[start : start + 4_000]]
            claimed += (await tasks.claim_within(epoch, ids, due, 2**62)).ready
        now = datetime.now(UTC)
        fired = [Fired(c, now, "TASKS", i + 1) for i, c in enumerate(claimed)]
        await tasks.mark_fired(epoch, fired, "test")
        await tasks.mark_fired(epoch, fired[:100], "test")  # a repeat adds nothing
        left = await pool.fetchval("SELECT count(*) FROM delayed_messages")
        logged = await pool.fetchval("SELECT count(*) FROM fire_log WHERE kind = 'delayed'")
        tombs = await pool.fetchval("SELECT count(*) FROM fired_tasks")
    finally:
        await pool.close()
    assert (left, logged, tombs) == (0, 12_000, 12_000)
    assert sizes[:-1] == [FIRED_CHUNK, FIRED_CHUNK, 12_000 - 2 * FIRED_CHUNK]


def _explaining(trees: dict[str, Any]) -> Callable[..., Awaitable[list[Any]]]:
    """A stand-in for `fenced` that explains each outcome statement (does not run it) as a
    pooled connection plans it: for its own parameters when `fenced` is asked to
    (`custom_plan`, as every outcome is now), else by a generic plan; keeping its plan in
    `trees` by the table it inserts into (`retry` for the one that inserts nothing)."""

    async def explained(
        conn: Any,
        epoch: int,
        writes: str,
        *args: Any,
        rows: str | None = None,
        custom_plan: bool = False,
    ) -> list[Any]:
        name = "retry"
        if "INSERT INTO " in writes:
            name = writes.split("INSERT INTO ", 1)[1].split(" ", 1)[0]
        mode = "force_custom_plan" if custom_plan else "force_generic_plan"
        await conn.execute(f"SET plan_cache_mode = {mode}")
        plan = await conn.fetchval(
            f"EXPLAIN (FORMAT JSON) WITH {epoch_module._LEAD}, {writes} "
            "SELECT (SELECT count(*) FROM lead) AS in_office",
            epoch,
            *args,
        )
        trees[name] = json.loads(plan)[0]["Plan"]
        trees[name]["custom_plan"] = custom_plan
        return []

    return explained


def _rescans_of_u(node: dict[str, Any], parent: str = "") -> list[str]:
    """The plan nodes that read the outcome's id array `u` once per row of another input:
    a scan of `u` as the inner side of a nested loop."""
    found = []
    alias = str(node.get("Alias", "")).split("_")[0]
    if (
        node.get("Node Type") in ("CTE Scan", "Function Scan")
        and alias == "u"
        and parent == "Nested Loop"
        and node.get("Parent Relationship") == "Inner"
    ):
        found.append(f"{node['Node Type']} on u, inner of a nested loop")
    for child in node.get("Plans", []):
        found += _rescans_of_u(child, str(node.get("Node Type")))
    return found


async def test_outcomes_read_their_ids_once_whatever_the_statistics_say(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The statistics of a table analyzed at rest say nothing is claimed. An outcome's plan
    must still read its array of ids once (a join by primary key or by hash), never once per
    claimed row: after a takeover of 200,000 that rescan made one booking of 5,000 run over
    60 s. Each outcome statement (fired, retry, dead) is explained (not run) under a generic
    plan, as a pooled connection runs it, over 200,000 rows of which 40,000 are claimed."""
    pool = await create_pool(database_url, min_size=1, max_size=1)
    tasks = TaskStore(PostgresStore(pool, Metrics()))
    due = datetime.now(UTC) - timedelta(seconds=1)
    trees: dict[str, Any] = {}

    try:
        epoch = await take_office(pool, "test")
        await pool.execute(
            "INSERT INTO delayed_messages (id, target, payload, due_at, scheduled_for) "
            "SELECT 't_' || g, 'mq.tasks.x', '{}', $1, $1 FROM generate_series(1, 200000) g",
            due,
        )
        await pool.execute("ANALYZE delayed_messages")  # at rest: nothing claimed
        claimed = []
        for start in range(1, 40_001, 5_000):
            ids = [f"t_{g}" for g in range(start, start + 5_000)]
            claimed += (await tasks.claim_within(epoch, ids, due, 2**62)).ready
        assert len(claimed) == 40_000
        monkeypatch.setattr(tasks_module, "fenced", _explaining(trees))
        now = datetime.now(UTC)
        fired = [Fired(c, now, "TASKS", i + 1) for i, c in enumerate(claimed[:5_000])]
        await tasks.mark_fired(epoch, fired, "test")
        later = now + timedelta(minutes=1)
        await tasks.retry_later(epoch, [(c, later, "nack", False) for c in claimed[5_000:10_000]])
        await tasks.kill(epoch, [(c, "too big", "too_large") for c in claimed[10_000:15_000]])
    finally:
        await pool.close()
    plans = {name: _rescans_of_u(tree) for name, tree in trees.items()}
    assert plans == {"fired_tasks": [], "retry": [], "dead_letters": []}
    # each planned for its own arrays: a generic plan estimates each at 10 elements, and then
    # rescanned `u` per row in a live run (a booking of 800: 200 ms, bench/README.md host Q)
    assert {name: tree["custom_plan"] for name, tree in trees.items()} == dict.fromkeys(plans, True)


def _reads_of_tasks(node: dict[str, Any]) -> list[str]:
    """How a plan reads `delayed_messages`: node type and index of each scan of it or of one
    of its indexes (a bitmap's index scans name no relation)."""
    found = []
    index = str(node.get("Index Name", ""))
    if node.get("Relation Name") == "delayed_messages" or index.startswith("delayed_messages"):
        if "Scan" in str(node.get("Node Type")):
            found.append(f"{node['Node Type']} {index}".strip())
    for child in node.get("Plans", []):
        found += _reads_of_tasks(child)
    return found


async def test_outcomes_read_their_rows_by_id_when_the_statistics_saw_an_empty_table(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Statistics taken while the table was nearly empty (a fresh deployment, or one whose
    ready tasks come and go in seconds) say there are a hundred tasks where thousands wait.
    An outcome must still read only its own rows, through the primary key: with step 1's
    join on the partition, such a plan read every ready task through the org index, joined
    them to `lead` and rescanned `u` for each (a booking of 130 among 4,000 ready tasks read
    528,710 join candidates, 38-44 ms instead of 4). Each outcome statement is explained
    under a generic plan, as a pooled connection runs it."""
    pool = await create_pool(database_url, min_size=1, max_size=1)
    tasks = TaskStore(PostgresStore(pool, Metrics()))
    due = datetime.now(UTC) - timedelta(seconds=1)
    trees: dict[str, Any] = {}

    try:
        epoch = await take_office(pool, "test")
        await pool.execute("ALTER TABLE delayed_messages SET (autovacuum_enabled = false)")
        await pool.execute(
            "INSERT INTO delayed_messages (id, target, payload, due_at, scheduled_for) "
            "SELECT 'a_' || g, 'mq.tasks.x', '{}', $1, $1 FROM generate_series(1, 100) g",
            due + timedelta(hours=1),
        )
        await pool.execute("ANALYZE delayed_messages")  # a hundred rows, none claimed
        await pool.execute(
            "INSERT INTO delayed_messages (id, target, payload, due_at, scheduled_for) "
            "SELECT 't_' || g, 'mq.tasks.x', '{}', $1::timestamptz + g * interval '1 ms', $1 "
            "FROM generate_series(1, 5000) g",
            due - timedelta(seconds=10),
        )
        ids = [f"t_{g}" for g in range(1, 601)]
        claimed = (await tasks.claim_within(epoch, ids, due, 2**62)).ready
        assert len(claimed) == 600
        monkeypatch.setattr(tasks_module, "fenced", _explaining(trees))
        now = datetime.now(UTC)
        fired = [Fired(c, now, "TASKS", i + 1) for i, c in enumerate(claimed[:200])]
        await tasks.mark_fired(epoch, fired, "test")
        later = now + timedelta(minutes=1)
        await tasks.retry_later(epoch, [(c, later, "nack", False) for c in claimed[200:400]])
        await tasks.kill(epoch, [(c, "too big", "too_large") for c in claimed[400:]])
    finally:
        await pool.close()
    plans = {name: _rescans_of_u(tree) for name, tree in trees.items()}
    reads = {name: sorted(set(_reads_of_tasks(tree))) for name, tree in trees.items()}
    assert plans == {"fired_tasks": [], "retry": [], "dead_letters": []}
    for name, how in reads.items():  # by its ids: the primary key, never a whole scan
        assert any(read.endswith(" delayed_messages_pkey") for read in how), (name, how)
        assert not any(read.startswith("Seq Scan") for read in how), (name, how)


async def test_a_resend_of_a_stored_task_locks_nothing_so_it_cannot_deadlock_a_claim(
    database_url: str,
) -> None:
    """Intake of ids already stored as tasks (lane redeliveries: after a node froze, a whole
    stretch comes again) takes no lock on those rows. It did (`ON CONFLICT DO UPDATE ...
    WHERE` locks the row it leaves alone), in the batch's order, while a claim locks in its own
    order: during a cluster fault test a claim of 161 due tasks failed with `deadlock
    detected` and they went out late. Here the resend's transaction stays open: a claim of
    the same rows must not wait for it, and the resend stores nothing."""
    pool = await create_pool(database_url, min_size=1, max_size=4)
    tasks = TaskStore(PostgresStore(pool, Metrics()))
    resender = await asyncpg.connect(database_url)
    try:
        epoch = await take_office(pool, "t")
        due = datetime.now(UTC) - timedelta(seconds=1)
        stored = batch(3, due)
        await insert(tasks, stored)
        held = resender.transaction()
        await held.start()
        again = await resender.fetch(
            "SELECT * FROM scheduler_intake_insert($1, $2, $3, $4, $5, $6, $7, NULL, NULL)",
            [t.id for t in reversed(stored)],
            ["mq.tasks.x"] * 3,
            [b"{}"] * 3,
            ["{}"] * 3,
            [5] * 3,
            [0] * 3,
            [0] * 3,
        )
        assert again == []  # every id is a stored task: nothing inserted, nothing changed
        async with asyncio.timeout(3):  # it waited on the resend's locks until its commit
            got = await claim(tasks, epoch, [t.id for t in stored], due)
        assert sorted(t.id for t in got) == sorted(t.id for t in stored)
        await held.rollback()
    finally:
        await resender.close()
        await pool.close()
