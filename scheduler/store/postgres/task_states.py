"""What a delayed task's status means in `delayed_messages`, written once.

Every statement in scheduler/ that selects, counts or changes tasks by their state builds the
predicate from here; tests/unit/test_task_states.py fails when one spells it by hand.

**The rule.** Since migration 0013 a claim is a heap-only update: a leader claims a *ready* row
(`pending` or `in_doubt`) by setting `claimed_epoch` (and `claimed_at`) and leaves `status`
alone, so no indexed column changes. Hence:

- a task is *claimed* when its status is ready and `claimed_epoch` is set, or when its status
  is `claimed` (only rows a daemon older than 0013 claimed, while an upgrade rolls);
- `pending` and `in_doubt`, as the API, the CLI and producers mean them, are that status *and*
  `claimed_epoch IS NULL`: a bare `status = 'pending'` also matches tasks being published;
- a reader reports every claimed row as `claimed` (`reported`);
- whatever makes a row ready again clears `claimed_epoch` with it (`UNCLAIM`, `REQUEUED`).

**Why fragments, not a view.** The hot statements (load, sweep, claim, reclaim, cancel) must
read the partial indexes on `status = 'pending'` and `status = 'in_doubt'`, and PostgreSQL
uses a partial index only when the query's own predicate implies the index's. A view's
computed state (`CASE ... END = 'pending'`) hides that from the planner, and the claim and
its outcomes are writes that could not go through it. So the rule stays SQL text, one literal
predicate per status, defined here and nowhere else.

`alias` qualifies the columns (`claimed("d")` -> `d.status`, `d.claimed_epoch`).
"""

from __future__ import annotations

PENDING = "pending"
IN_DOUBT = "in_doubt"
CLAIMED = "claimed"  # reported for every claimed row; stored only by daemons older than 0013
READY_STATUSES = (PENDING, IN_DOUBT)  # statuses a claim takes; each has its partial index
READY = "('pending', 'in_doubt')"
# Makes a claimed row ready again (a retry): the claim marker goes with the claim.
UNCLAIM = "claimed_epoch = NULL"
# A finished row made pending again, unclaimed, as intake would have stored it (a replay).
REQUEUED = "status = 'pending', claimed_epoch = NULL, claimed_at = NULL"


def _col(alias: str, name: str) -> str:
    return f"{alias}.{name}" if alias else name


def _ready_status(status: str) -> str:
    if status not in READY_STATUSES:
        raise ValueError(f"status: {status!r} is not one of {READY_STATUSES}")
    return status


def ready(alias: str = "") -> str:
    """A row of a ready status, claimed or not (an unfinished task)."""
    return f"{_col(alias, 'status')} IN {READY}"


def stored_as(status: str, alias: str = "") -> str:
    """A row stored with ready `status`, claimed or not: one literal status, so the statement
    reads that status's partial index (a listing of every task merges them)."""
    return f"{_col(alias, 'status')} = '{_ready_status(status)}'"


def not_ready(alias: str = "") -> str:
    """A row of no ready status: finished (cancelled, expired, dead), an intent, or claimed by
    a daemon older than migration 0013 (read over migration 0026's index)."""
    return f"{_col(alias, 'status')} NOT IN {READY}"


def unclaimed(status: str, alias: str = "") -> str:
    """A task of ready `status` that no leader holds: what `pending` / `in_doubt` mean. One
    literal status, so the statement reads that status's partial index."""
    status = _ready_status(status)
    return f"{_col(alias, 'status')} = '{status}' AND {_col(alias, 'claimed_epoch')} IS NULL"


def ready_by_id(alias: str = "") -> str:
    """`ready`, for statements that find their rows by id (the primary key): the same test,
    but one no partial index can serve. PostgreSQL reads a partial index whose predicate the
    query implies beside the primary key (a BitmapAnd) when its statistics say the index is
    small, and `ready` implies that of `delayed_messages_org_open` (every unfinished task):
    seen on a claim of 25 ids, the bitmap of all 10,605 entries of that index ANDed with 25 of
    the key's, ~480 index entries read per task fired at 1,000 tasks/s (bench/README.md). A
    CASE hides the implication, so such a statement reads the key alone."""
    return f"CASE WHEN {ready(alias)} THEN true ELSE false END"


def ready_unclaimed(alias: str = "") -> str:
    """A task a claim may take: ready and held by no leader (rows found by id)."""
    return f"{ready_by_id(alias)} AND {_col(alias, 'claimed_epoch')} IS NULL"


def claimed_as(status: str, alias: str = "") -> str:
    """A claimed task whose stored status is the ready `status` (read over its partial index)."""
    status = _ready_status(status)
    return f"{_col(alias, 'status')} = '{status}' AND {_col(alias, 'claimed_epoch')} IS NOT NULL"


def claimed_by(epoch: str, alias: str = "") -> str:
    """A task the leader of `epoch` (an SQL expression, say `$1`) holds: only its outcome
    (fired, retry, expired, dead) may change the row (rows found by id: `ready_by_id`)."""
    return f"{ready_by_id(alias)} AND {_col(alias, 'claimed_epoch')} = {epoch}"


def legacy_claimed(alias: str = "") -> str:
    """A row a daemon older than migration 0013 claimed (its own partial index)."""
    return f"{_col(alias, 'status')} = '{CLAIMED}'"


def claimed(alias: str = "") -> str:
    """A task some leader holds, this daemon's claim or an older daemon's."""
    return f"({legacy_claimed(alias)} OR {claimed_as_any(alias)})"


def claimed_as_any(alias: str = "") -> str:
    """A ready row with a claim marker (any ready status, any epoch)."""
    return f"{ready(alias)} AND {_col(alias, 'claimed_epoch')} IS NOT NULL"


def reported(alias: str = "") -> str:
    """The status a reader reports: `claimed` for a claimed row, else the stored status."""
    return f"CASE WHEN {claimed(alias)} THEN '{CLAIMED}' ELSE {_col(alias, 'status')} END"


def answered(alias: str = "") -> str:
    """The status a cancel or a reschedule that changed nothing answers from: `reported`, but
    `in_doubt` for a claimed task that has been in doubt (republished: it may already be
    delivered, so it is in flight, not merely claimed)."""
    doubted = _col(alias, "doubted")
    return f"CASE WHEN {claimed(alias)} AND {doubted} THEN '{IN_DOUBT}' ELSE {reported(alias)} END"


def orphaned(epoch: str, stale: str, alias: str = "") -> str:
    """A claim a leader of `epoch` takes over: another epoch's, or (with `stale`, an interval
    expression that may be NULL) any claim older than that, its own included."""
    marker = _col(alias, "claimed_epoch")
    since = _col(alias, "claimed_at")
    return f"({marker} <> {epoch} OR ({stale} IS NOT NULL AND {since} < now() - {stale}))"


def claim(epoch: str) -> str:
    """The SET list of a claim by the leader of `epoch` (status unchanged: a HOT update)."""
    return f"claimed_epoch = {epoch}, claimed_at = now()"


def ready_again(doubted: str) -> str:
    """The ready status of a task put back after a failed publish: `in_doubt` when `doubted`
    (an SQL boolean) holds, `pending` otherwise."""
    return f"CASE WHEN {doubted} THEN '{IN_DOUBT}' ELSE '{PENDING}' END"


def reclaimed(alias: str = "") -> str:
    """The status of a row taken over by a reclaim: kept, unless an older daemon stored
    `claimed` (then its ready status again, from `doubted`)."""
    status = _col(alias, "status")
    return (
        f"CASE WHEN {status} <> '{CLAIMED}' THEN {status} "
        f"ELSE {ready_again(_col(alias, 'doubted'))} END"
    )


def stored(state: str, epoch: str) -> str:
    """`status, claimed_epoch` values storing a row that reads as the reported `state` (an SQL
    text expression), claimed by `epoch` when that state is `claimed` (test data)."""
    is_claimed = f"{state} = '{CLAIMED}'"
    return f"CASE WHEN {is_claimed} THEN '{PENDING}' ELSE {state} END, " + (
        f"CASE WHEN {is_claimed} THEN {epoch} END"
    )
