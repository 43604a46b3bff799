"""Every Prometheus metric of the daemon, defined once. Names carry `_total` / `_seconds` suffixes.

Metrics live in their own registry so tests and several daemons in one process do not collide;
`Metrics()` makes a fresh set.

Metrics are fed from events. A part of the daemon never updates an instrument: it reports what
happened through a small Protocol of its own, declared beside it (`scheduler.leadership.events`,
`scheduler.engine.delayed.events`, ...), and `Metrics` is the listener that implements all of
them, one mixin below per part, turning each event into its instruments. Adding a metric: define
the instrument in `_Instruments`, update it in the part's mixin, add the alert or panel
(docs/development.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from scheduler.records import Fired

LATENESS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
DB_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)

_P = "mq_scheduler_"


class _Instruments:
    """The instruments, in one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.info = Gauge(
            _P + "build_info", "Version and instance.", ["version", "instance"], registry=r
        )
        self.connected = Gauge(
            _P + "connected", "1 while connected to the service.", ["service"], registry=r
        )
        self.reconnects = Counter(
            _P + "reconnects_total", "Reconnections per service.", ["service"], registry=r
        )
        self.disconnects = Counter(
            _P + "disconnects_total", "Lost connections per service.", ["service"], registry=r
        )
        self.stale_links = Counter(
            _P + "stale_links_total",
            "Links closed because their server stopped answering PINGs, per service.",
            ["service"],
            registry=r,
        )
        self.is_leader = Gauge(_P + "is_leader", "1 while this instance leads.", registry=r)
        self.leader_epoch = Gauge(
            _P + "leader_epoch", "Fencing epoch this instance holds (0: none).", registry=r
        )
        self.partitions_held = Gauge(
            _P + "partitions_held",
            "Partitions of this engine's current term (P > 1; 0 out of office).",
            registry=r,
        )
        self.partition_moves = Counter(
            _P + "partition_moves_total",
            "Partitions this engine took that its previous term did not hold (P > 1): each "
            "move is counted once, by the engine it moved to.",
            registry=r,
        )
        self.partitions_by_owner = Gauge(
            _P + "partitions_by_owner",
            "Partitions each engine holds as the edge read the lease bucket (owner `unknown`: "
            "a lease value no engine wrote); the same fleet view from every edge.",
            ["owner"],
            registry=r,
        )
        self.partitions_unowned = Gauge(
            _P + "partitions_unowned",
            "Partitions whose lease nobody holds, as the edge read the lease bucket.",
            registry=r,
        )
        self.lease_renew_seconds = Histogram(
            _P + "lease_renew_seconds", "Lease renew round trip.", buckets=DB_BUCKETS, registry=r
        )
        self.pending = Gauge(
            _P + "pending_tasks", "Delayed tasks waiting to fire (from PostgreSQL).", registry=r
        )
        self.org_pending = Gauge(
            _P + "org_pending_tasks",
            "Unfinished tasks per organisation, as the leader counts them for quotas "
            "(bounded labels: SCHEDULER_ORG_METRIC_LABELS orgs, the rest 'other').",
            ["org"],
            registry=r,
        )
        self.quota_refused = Counter(
            _P + "quota_refused_total",
            "New tasks refused because their organisation was at SCHEDULER_ORG_MAX_PENDING.",
            ["org"],
            registry=r,
        )
        self.heap_size = Gauge(
            _P + "heap_size", "Tasks held in the in-memory horizon heap.", registry=r
        )
        self.fired = Counter(
            _P + "fired_total", "Deliveries acknowledged by JetStream.", ["kind"], registry=r
        )
        self.lateness = Histogram(
            _P + "lateness_seconds",
            "Fire time minus due time.",
            ["kind"],
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        self.intake = Counter(_P + "intake_total", "Intake outcomes.", ["outcome"], registry=r)
        self.dead_letters = Counter(
            _P + "dead_letters_total", "Dead-lettered tasks by reason.", ["reason"], registry=r
        )
        self.dead_letters_unstored = Counter(
            _P + "dead_letters_unstored_total",
            "Intake refusals not stored in dead_letters: their organisation or subject was past "
            "SCHEDULER_DEAD_LETTER_RATE (the DLQ stream still gets them; bounded labels: "
            "SCHEDULER_ORG_METRIC_LABELS orgs, the rest 'other', '' for no organisation).",
            ["org", "reason"],
            registry=r,
        )
        self.dead_letters_pruned = Counter(
            _P + "dead_letters_pruned_total",
            "Dead letters deleted by the housekeeping, older than SCHEDULER_DLQ_MAX_AGE.",
            registry=r,
        )
        self.expired = Counter(_P + "expired_total", "Tasks that expired undelivered.", registry=r)
        self.publish_retries = Counter(
            _P + "publish_retries_total",
            "Publish attempts that failed and will be retried.",
            registry=r,
        )
        self.db_seconds = Histogram(
            _P + "db_seconds",
            "PostgreSQL statement latency.",
            ["op"],
            buckets=DB_BUCKETS,
            registry=r,
        )
        self.dispatch_lateness = Histogram(
            _P + "dispatch_lateness_seconds",
            "Publish call time minus due time (the daemon's share of lateness).",
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        self.cron_skipped = Counter(
            _P + "cron_skipped_total",
            "Cron occurrences not fired (busy: forbid and the last run is unacked).",
            ["reason"],
            registry=r,
        )
        self.loop_lag = Histogram(
            _P + "event_loop_lag_seconds",
            "How late a 10 ms timer fires: the daemon's own scheduling delay.",
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        self.dup_window_short = Gauge(
            _P + "duplicate_window_short",
            "1 when a target stream's duplicate window is shorter than the failover span.",
            ["stream"],
            registry=r,
        )
        self.dead_letter_copies_failed = Counter(
            _P + "dead_letter_copies_failed_total",
            "Dead-letter copies the DLQ stream did not acknowledge (the table row is kept).",
            ["reason"],
            registry=r,
        )
        self.cron_failures = Counter(
            _P + "cron_publish_failures_total",
            "Cron publishes that failed; the job then backs off (doubling, capped, jittered).",
            registry=r,
        )
        self.cron_backing_off = Gauge(
            _P + "cron_jobs_backing_off",
            "Cron jobs waiting out a backoff after their target failed.",
            registry=r,
        )
        self.cron_permanent_failures_total = Counter(
            _P + "cron_permanent_failures_total",
            "Cron jobs stopped by a permanent publish error (too_large: over max_payload).",
            ["reason"],
            registry=r,
        )
        self.cron_jobs_failed = Gauge(
            _P + "cron_jobs_failed",
            "Cron jobs the leader does not fire: failed until their definition changes.",
            registry=r,
        )
        self.publish_in_doubt = Counter(
            _P + "publish_in_doubt_total",
            "Deliveries sent but never acknowledged: in doubt until republished (same id).",
            registry=r,
        )
        self.clock_skew = Gauge(
            _P + "clock_skew_seconds",
            "This host's wall clock minus PostgreSQL's, last measured.",
            registry=r,
        )
        self.clock_skew_exceeded = Gauge(
            _P + "clock_skew_exceeded",
            "1 while the clock skew is beyond SCHEDULER_MAX_CLOCK_SKEW (office refused).",
            registry=r,
        )

        # -- operations surface (forecast and backlog gauges, refreshed by the leader) --------
        self.due_tasks = Gauge(
            _P + "due_tasks",
            "Pending delayed tasks due within the window (overdue ones included), for the top "
            "subjects and `other`; exported by the leader only.",
            ["subject", "within"],
            registry=r,
        )
        self.dead_letters_unresolved = Gauge(
            _P + "dead_letters_unresolved",
            "Dead letters nobody has resolved or replayed yet; exported by the leader only.",
            registry=r,
        )
        self.intake_backlog = Gauge(
            _P + "intake_backlog",
            "Messages on the delay lane not yet taken by the leader's intake consumer.",
            registry=r,
        )
        self.api_requests = Counter(
            _P + "api_requests_total",
            "Management API requests by route template, method and status code.",
            ["route", "method", "status"],
            registry=r,
        )
        self.activity_unrecorded = Counter(
            _P + "activity_unrecorded_total",
            "Operator actions the activity log could not record (PostgreSQL unreachable or "
            "slow); the action itself was done and answered, and logged as "
            "api.activity_unrecorded.",
            registry=r,
        )
        self.activity_pruned = Counter(
            _P + "activity_pruned_total",
            "Activity-log rows deleted past SCHEDULER_ACTIVITY_RETENTION.",
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _LeadershipEvents(_Instruments):
    """`scheduler.leadership.events.LeadershipEvents`."""

    def took_office(self, epoch: int) -> None:
        self.is_leader.set(1)
        self.leader_epoch.set(epoch)

    def left_office(self) -> None:
        self.is_leader.set(0)
        self.leader_epoch.set(0)
        self.partitions_held.set(0)

    def renewed(self, seconds: float) -> None:
        self.lease_renew_seconds.observe(seconds)

    def clock_checked(self, skew: float, exceeded: bool) -> None:
        self.clock_skew.set(skew)
        self.clock_skew_exceeded.set(1 if exceeded else 0)


class _DelayedEvents(_Instruments):
    """`scheduler.engine.delayed.events.DelayedEvents`: intake, claims, dispatch, books."""

    def intake_committed(self, accepted: int, duplicates: int, cancelled: int) -> None:
        self.intake.labels("accepted").inc(accepted)
        if duplicates:
            self.intake.labels("duplicate").inc(duplicates)
        if cancelled:
            self.intake.labels("cancelled_on_arrival").inc(cancelled)

    def intake_refused(self, reasons: Iterable[str]) -> None:
        for reason in reasons:
            self.intake.labels(reason).inc()
            self.dead_letters.labels(reason).inc()

    def dead_letter_unstored(self, org: str, reason: str) -> None:
        self.dead_letters_unstored.labels(org, reason).inc()

    def dead_letter_copy_failed(self, reason: str) -> None:
        self.dead_letter_copies_failed.labels(reason).inc()

    def quota_refusals(self, orgs: Iterable[str]) -> None:
        for org in orgs:
            self.quota_refused.labels(org).inc()

    def org_pending_counted(self, counts: Mapping[str, int]) -> None:
        self.org_pending.clear()
        self.org_pending_changed(counts)

    def org_pending_changed(self, counts: Mapping[str, int]) -> None:
        for org, n in counts.items():
            self.org_pending.labels(org).set(n)

    def horizon_sized(self, tasks: int) -> None:
        self.heap_size.set(tasks)

    def pending_counted(self, tasks: int) -> None:
        self.pending.set(tasks)

    def duplicate_window_checked(self, stream: str, short: bool) -> None:
        self.dup_window_short.labels(stream).set(1 if short else 0)

    def tasks_dispatched(self, now_ms: int, due: Mapping[int, int]) -> None:
        for due_ms, n in due.items():
            observe_many(self.dispatch_lateness, (now_ms - due_ms) / 1000, n)

    def tasks_fired(self, fired: Sequence[Fired]) -> None:
        groups: dict[tuple[datetime, datetime], int] = {}  # tasks fired together, due together
        for f in fired:
            key = (f.fired_at, f.task.scheduled_for)
            groups[key] = groups.get(key, 0) + 1
        histogram = self.lateness.labels("delayed")
        for (fired_at, scheduled_for), n in groups.items():
            observe_many(histogram, max((fired_at - scheduled_for).total_seconds(), 0.0), n)
        self.fired.labels("delayed").inc(len(fired))

    def tasks_expired(self, count: int) -> None:
        self.expired.inc(count)

    def publishes_retried(self, count: int, in_doubt: int) -> None:
        self.publish_retries.inc(count)
        if in_doubt:
            self.publish_in_doubt.inc(in_doubt)

    def tasks_dead(self, reasons: Iterable[str]) -> None:
        for reason in reasons:
            self.dead_letters.labels(reason).inc()


class _CronEvents(_Instruments):
    """`scheduler.engine.cron.events.CronEvents`: the catalog, firing, cursors."""

    def cron_failed_count(self, count: int) -> None:
        self.cron_jobs_failed.set(count)

    def cron_occurrence_skipped(self, reason: str) -> None:
        self.cron_skipped.labels(reason).inc()

    def cron_occurrence_fired(self, lateness: float) -> None:
        self.fired.labels("cron").inc()
        self.lateness.labels("cron").observe(max(lateness, 0.0))

    def cron_publish_failed(self) -> None:
        self.cron_failures.inc()

    def cron_backoff_count(self, count: int) -> None:
        self.cron_backing_off.set(count)

    def cron_job_stopped(self, reason: str) -> None:
        self.cron_permanent_failures_total.labels(reason).inc()


class _BusEvents(_Instruments):
    """`scheduler.bus.nats.events.BusEvents`: the connection and the publisher."""

    def nats_link(self, up: bool) -> None:
        self.connected.labels("nats").set(1 if up else 0)

    def nats_disconnected(self) -> None:
        self.disconnects.labels("nats").inc()

    def nats_stale_link(self) -> None:
        self.stale_links.labels("nats").inc()

    def nats_reconnected(self) -> None:
        self.reconnects.labels("nats").inc()


class _DaemonEvents(_Instruments):
    """The daemon's own events, the store's and the edge's (`scheduler.daemon.events`)."""

    def daemon_started(self, version: str, instance: str) -> None:
        self.info.labels(version, instance).set(1)

    def standing_by(self) -> None:
        self.is_leader.set(0)

    def term_partitions(self, held: int, gained: int) -> None:
        self.partitions_held.set(held)
        self.partition_moves.inc(gained)

    def partition_map_read(self, owners: Mapping[str, Sequence[int]], unowned: int) -> None:
        self.partitions_by_owner.clear()  # an engine gone from the map leaves no series behind
        for owner, partitions in owners.items():
            self.partitions_by_owner.labels(owner).set(len(partitions))
        self.partitions_unowned.set(unowned)

    def postgres_connected(self) -> None:
        self.connected.labels("postgres").set(1)

    def dead_letters_deleted(self, count: int) -> None:
        self.dead_letters_pruned.inc(count)

    def activity_deleted(self, count: int) -> None:
        self.activity_pruned.inc(count)

    def loop_lag_measured(self, seconds: float) -> None:
        self.loop_lag.observe(seconds)

    # scheduler.store.postgres.events.StoreEvents
    def statement_timed(self, op: str, seconds: float) -> None:
        self.db_seconds.labels(op).observe(seconds)

    # scheduler.api.events.ApiEvents
    def request_served(self, route: str, method: str, status: int) -> None:
        self.api_requests.labels(route, method, str(status)).inc()

    def action_unrecorded(self) -> None:
        self.activity_unrecorded.inc()

    # scheduler.operations.events.OperationsEvents
    def leader_gauges_refreshed(
        self, due: Mapping[tuple[str, str], int], unresolved: int, backlog: int | None
    ) -> None:
        self.due_tasks.clear()
        for (subject, within), count in due.items():
            self.due_tasks.labels(subject, within).set(count)
        self.dead_letters_unresolved.set(unresolved)
        if backlog is not None:
            self.intake_backlog.set(backlog)

    def leader_gauges_cleared(self) -> None:
        self.due_tasks.clear()
        self.dead_letters_unresolved.set(0)
        self.intake_backlog.set(0)


class Metrics(_LeadershipEvents, _DelayedEvents, _CronEvents, _BusEvents, _DaemonEvents):
    """The daemon's metrics in one registry, and the listener of every part's events."""


def observe_many(histogram: Histogram, amount: float, count: int) -> None:
    """`histogram.observe(amount)` `count` times, in one step (a batch of tasks that share a
    due time and a firing time). Uses the client's bucket internals when they are there, else
    observes one by one."""
    if count == 1:
        histogram.observe(amount)
        return
    try:
        buckets, bounds, total = histogram._buckets, histogram._upper_bounds, histogram._sum
    except AttributeError:  # another client version: the slow, public way
        for _ in range(count):
            histogram.observe(amount)
        return
    histogram._raise_if_not_observable()
    total.inc(amount * count)
    for i, bound in enumerate(bounds):
        if amount <= bound:
            buckets[i].inc(count)
            break
