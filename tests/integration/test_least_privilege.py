"""deploy/nats/nats-server.conf on a real nats-server: the daemon works under its own user, and a
producer reaches nothing but its organisation's slice of the delay lane and of the API.

The server is started with the shipped file as it is (passwords from its environment, as in
production); the only command-line additions are the port and the JetStream store directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import nats
import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from scheduler.settings import Settings
from tests.integration.test_delayed import envelope
from tests.support.compat import NatsServerOf, Servers
from tests.support.helpers import DaemonRunner

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "nats-server.conf"
PASSWORDS = {
    "scheduler": "MQ_SCHEDULER_NATS_PASSWORD",
    "ops": "MQ_OPS_NATS_PASSWORD",
    "producer-acme": "MQ_PRODUCER_ACME_NATS_PASSWORD",
    "producer-globex": "MQ_PRODUCER_GLOBEX_NATS_PASSWORD",
    "sys": "MQ_SYS_NATS_PASSWORD",
}
DENIED = 1.0  # how long a request to a denied subject is given before it counts as unanswered


@dataclass
class Secured:
    """The server started from the shipped config: its URL and its log file."""

    url: str
    log: Path

    def violations(self, user: str) -> list[str]:
        lines = self.log.read_text(errors="replace").splitlines()
        return [line for line in lines if f'"MQ/user:{user}"' in line and "Violation" in line]


@pytest.fixture(scope="module")
def secured(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    """nats-server (current or compat) running deploy/nats/nats-server.conf."""
    saved = {var: os.environ.get(var) for var in PASSWORDS.values()}
    os.environ.update({var: f"pw-{user}" for user, var in PASSWORDS.items()})
    store = tmp_path_factory.mktemp("nats-secured")
    try:
        server = NatsServerOf(store, servers.nats_binary, extra=["-c", str(CONFIG)]).start()
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
    yield Secured(server.url, store / "nats-server.log")
    server.stop()


@dataclass
class User:
    """A connection as one user of the config, with the errors the server sent it."""

    nc: Client
    errors: list[str] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def denied(self, pattern: str) -> bool:
        return any(re.search(pattern, e, re.IGNORECASE) for e in self.errors)

    async def wait_denied(self, subject: str, kind: str = "publish") -> None:
        """The server reported a permissions violation of `kind` for `subject`."""
        pattern = rf'permissions violation for {kind}\w* to "{re.escape(subject)}"'
        async with asyncio.timeout(3):
            while not self.denied(pattern):
                self.changed.clear()
                await self.changed.wait()


async def connect(url: str, user: str, inbox: str | None = None) -> User:
    found = User(nc=None)  # type: ignore[arg-type]

    async def on_error(exc: Exception) -> None:
        found.errors.append(str(exc))
        found.changed.set()

    options: dict[str, Any] = {"user": user, "password": f"pw-{user}", "error_cb": on_error}
    if inbox is not None:
        options["inbox_prefix"] = inbox
    found.nc = await nats.connect(url, **options)
    return found


@dataclass
class Tenancy:
    """The daemon under its config user, an operator, and the producers of two orgs."""

    server: Secured
    ops: User
    acme: User
    globex: User
    runner: DaemonRunner
    database_url: str

    async def publish(self, who: User, subject: str, doc: dict[str, Any]) -> None:
        await who.nc.jetstream().publish(
            subject, json.dumps(doc).encode(), headers={"Nats-Msg-Id": doc["id"]}
        )

    async def read(self, stream: str, count: int, within: float = 5.0) -> list[Any]:
        config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL)
        sub = await self.ops.nc.jetstream().pull_subscribe(
            ">", durable=None, stream=stream, config=config
        )
        out: list[Any] = []
        try:
            async with asyncio.timeout(within):
                while len(out) < count:
                    try:
                        out += await sub.fetch(count - len(out), timeout=0.5)
                    except TimeoutError:
                        continue
        except TimeoutError:
            pass
        finally:
            await sub.unsubscribe()
        return out

    async def stream_messages(self, stream: str) -> int:
        info = await self.ops.nc.jetstream().stream_info(stream)
        return int(info.state.messages)


@pytest.fixture
async def tenancy(secured: Secured, database_url: str, tmp_path: Path) -> AsyncIterator[Tenancy]:
    ops = await connect(secured.url, "ops")
    js = ops.nc.jetstream()
    await js.add_stream(name="TASKS", subjects=["mq.org.>", "mq.tasks.>"], duplicate_window=120)
    (tmp_path / "schedules").mkdir()
    settings = Settings(
        schedules_dir=tmp_path / "schedules",
        nats_url=secured.url,
        nats_user="scheduler",
        nats_password="pw-scheduler",
        database_url=database_url,
        http_port=0,
        metrics_port=0,
        data_dir=tmp_path / "data",
        instance_id="least-privilege",
        lease_ttl=3,
    )
    runner = DaemonRunner(settings)
    acme = await connect(secured.url, "producer-acme", "_INBOX_acme")
    globex = await connect(secured.url, "producer-globex", "_INBOX_globex")
    try:
        await runner.start()
        yield Tenancy(secured, ops, acme, globex, runner, database_url)
    finally:
        await runner.stop()
        for user in (acme, globex):
            await user.nc.close()
        for info in await js.streams_info():
            assert info.config.name is not None
            await js.delete_stream(info.config.name)
        await ops.nc.close()


def due_in(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


async def test_the_daemon_runs_under_its_user_and_delivers_a_delayed_task(
    tenancy: Tenancy,
) -> None:
    """Under the config's `scheduler` user the daemon provisions, takes the lease, delivers a
    delayed task and answers the API, and the server logs no violation of that user."""
    doc = envelope(due_in(0.5), org_id="acme")
    await tenancy.publish(tenancy.acme, "mq.delay.org.acme.work", doc)
    [msg] = await tenancy.read("TASKS", 1)
    assert msg.subject == "mq.org.acme.work" and json.loads(msg.data)["id"] == doc["id"]
    reply = await tenancy.acme.nc.request(
        "scheduler.v1.get.org.acme.work", json.dumps({"id": doc["id"]}).encode(), timeout=3
    )
    assert json.loads(reply.data)["status"] == "found"
    assert tenancy.runner.daemon is not None and tenancy.runner.daemon.leadership.role == "leader"
    assert tenancy.server.violations("scheduler") == []


async def test_a_producer_can_neither_write_nor_delete_the_lease_bucket(tenancy: Tenancy) -> None:
    """Put, delete and purge of the lease key and deletion of its bucket are all refused by
    the server; the lease is untouched and the daemon still leads."""
    ops_kv = await tenancy.ops.nc.jetstream().key_value("scheduler_leader")
    before = await ops_kv.get("leader")
    nc = tenancy.acme.nc
    await nc.publish("$KV.scheduler_leader.leader", b"mine")
    await tenancy.acme.wait_denied("$KV.scheduler_leader.leader")
    with pytest.raises(Exception):  # noqa: B017 - denied: no answer, or an error, never a success
        await asyncio.wait_for(_delete_key(nc, "scheduler_leader", "leader"), DENIED)
    with pytest.raises(Exception):  # noqa: B017
        await asyncio.wait_for(nc.jetstream().delete_stream("KV_scheduler_leader"), DENIED)
    await tenancy.acme.wait_denied("$JS.API.STREAM.DELETE.KV_scheduler_leader")
    after = await ops_kv.get("leader")
    assert after.revision is not None and before.revision is not None
    assert after.revision >= before.revision
    for entry in (before, after):
        assert json.loads(entry.value or b"")["instance"] == "least-privilege"
    assert "scheduler_leader" in [s.config.name[3:] for s in await _streams(tenancy)]
    assert tenancy.runner.daemon is not None and tenancy.runner.daemon.leadership.role == "leader"


async def test_a_producer_can_neither_write_nor_delete_the_state_bucket(tenancy: Tenancy) -> None:
    """The cron cursors' and heartbeats' bucket is as closed to a producer as the lease's."""
    nc = tenancy.acme.nc
    await nc.publish("$KV.scheduler_state.instances.least-privilege", b"{}")
    await tenancy.acme.wait_denied("$KV.scheduler_state.instances.least-privilege")
    for call, api in (
        (nc.jetstream().purge_stream, "PURGE"),
        (nc.jetstream().delete_stream, "DELETE"),
    ):
        with pytest.raises(Exception):  # noqa: B017 - denied: no answer, never a success
            await asyncio.wait_for(call("KV_scheduler_state"), DENIED)
        await tenancy.acme.wait_denied(f"$JS.API.STREAM.{api}.KV_scheduler_state")
    ops_kv = await tenancy.ops.nc.jetstream().key_value("scheduler_state")
    beat = await ops_kv.get("instances.least-privilege")
    assert json.loads(beat.value or b"")["instance"] == "least-privilege"


async def test_a_standby_under_the_same_user_takes_over_and_delivers(tenancy: Tenancy) -> None:
    """A second daemon under the `scheduler` user stands by (campaign, watch, heartbeat),
    takes the lease when the leader stops, and delivers; still no violation of that user."""
    standby = DaemonRunner(tenancy.runner.settings.with_overrides(instance_id="standby"))
    await standby.start()
    try:
        assert standby.daemon is not None and standby.daemon.leadership.role == "standby"
        await tenancy.runner.stop()
        async with asyncio.timeout(10):
            await standby.daemon.leadership.wait_for_office()
        doc = envelope(due_in(0.3), org_id="acme")
        await tenancy.publish(tenancy.acme, "mq.delay.org.acme.work", doc)
        [msg] = await tenancy.read("TASKS", 1)
        assert json.loads(msg.data)["id"] == doc["id"]
    finally:
        await standby.stop()
    assert tenancy.server.violations("scheduler") == []


async def _delete_key(nc: Client, bucket: str, key: str) -> None:
    kv = await nc.jetstream().key_value(bucket)
    await kv.delete(key)


async def _streams(tenancy: Tenancy) -> list[Any]:
    return list(await tenancy.ops.nc.jetstream().streams_info())


@pytest.mark.parametrize("stream", ["MQ_DELAY", "MQ_DLQ", "TASKS"])
async def test_a_producer_can_neither_delete_nor_purge_a_stream(
    tenancy: Tenancy, stream: str
) -> None:
    """Stream delete and purge are refused: the stream and its messages stay."""
    await tenancy.publish(tenancy.ops, "mq.tasks.keep", envelope())
    held = await tenancy.stream_messages(stream)
    js = tenancy.acme.nc.jetstream()
    for call, api in ((js.purge_stream, "PURGE"), (js.delete_stream, "DELETE")):
        with pytest.raises(Exception):  # noqa: B017 - denied: no answer, never a success
            await asyncio.wait_for(call(stream), DENIED)
        await tenancy.acme.wait_denied(f"$JS.API.STREAM.{api}.{stream}")
    assert await tenancy.stream_messages(stream) == held
    assert stream in [s.config.name for s in await _streams(tenancy)]


async def test_a_producer_cannot_read_another_orgs_tasks(tenancy: Tenancy) -> None:
    """Subscribing to another org's deliveries, the daemon's inbox or another org's inbox,
    reading the lane or a target stream through a consumer, and asking the API about
    another org's task are all refused; the other org's task is delivered all the same."""
    acme = tenancy.acme
    peeked: list[Any] = []

    async def peek(msg: Any) -> None:
        peeked.append(msg)

    for subject in ("mq.org.globex.>", "mq.delay.>", "_INBOX.>", "_INBOX_globex.>", ">"):
        await acme.nc.subscribe(subject, cb=peek)
        await acme.wait_denied(subject, "subscription")
    js = acme.nc.jetstream()
    for stream in ("TASKS", "MQ_DELAY"):
        with pytest.raises(Exception):  # noqa: B017 - denied: no answer, never a consumer
            await asyncio.wait_for(js.pull_subscribe(">", durable=None, stream=stream), DENIED)
    doc = envelope(due_in(0.3), org_id="globex")
    await tenancy.publish(tenancy.globex, "mq.delay.org.globex.work", doc)
    with pytest.raises(Exception):  # noqa: B017 - denied: no answer
        body = json.dumps({"id": doc["id"]}).encode()
        await acme.nc.request("scheduler.v1.get.org.globex.work", body, timeout=DENIED)
    await acme.wait_denied("scheduler.v1.get.org.globex.work")
    [msg] = await tenancy.read("TASKS", 1)
    assert msg.subject == "mq.org.globex.work"
    await asyncio.sleep(0.2)  # a leak would have arrived with the delivery
    assert peeked == []


@pytest.mark.parametrize(
    "subject",
    [
        "mq.delay.org.globex.work",  # another org's slice
        "mq.delay.tasks.work",  # a shared queue
        "mq.delay.org.acmex.work",  # a prefix of its name is not its name
        "mq.org.acme.work",  # its own target, but not through the daemon
        "scheduler.v1.schedule.org.globex.work",
    ],
)
async def test_a_producer_cannot_reach_a_target_outside_its_slice(
    tenancy: Tenancy, subject: str
) -> None:
    """Publishing anywhere but its slice of the lane and API is refused by the server, so the
    daemon never sees the task: nothing is delivered and the lane holds nothing of it."""
    doc = envelope(org_id="acme")
    await tenancy.acme.nc.publish(subject, json.dumps(doc).encode())
    await tenancy.acme.wait_denied(subject)
    control = envelope(org_id="acme")
    await tenancy.publish(tenancy.acme, "mq.delay.org.acme.work", control)
    [got] = await tenancy.read("TASKS", 1)
    assert json.loads(got.data)["id"] == control["id"]
    assert await tenancy.stream_messages("TASKS") == 1
    assert await tenancy.stream_messages("MQ_DLQ") == 0


async def test_an_org_id_other_than_the_subjects_org_is_dead_lettered(tenancy: Tenancy) -> None:
    """An acme producer that claims globex in `org_id` gets its task dead-lettered as
    `org_mismatch` naming the field, and a refusal from the schedule verb; acme's next task is
    delivered (the daemon keeps running)."""
    claimed = envelope(org_id="globex")
    await tenancy.publish(tenancy.acme, "mq.delay.org.acme.work", claimed)
    [dead] = await tenancy.read("MQ_DLQ", 1)
    assert dead.subject == "mq.dlq.org.acme.work"
    assert dead.headers["Mq-Error-Reason"] == "org_mismatch"
    assert dead.headers["Mq-Error"].startswith('org_id: "globex" disagrees with organisation')
    missing = envelope()
    reply = await tenancy.acme.nc.request(
        "scheduler.v1.schedule.org.acme.work", json.dumps(missing).encode(), timeout=3
    )
    error = json.loads(reply.data)["error"]
    assert error["code"] == "bad_request" and error["message"].startswith("org_id: is required")
    control = envelope(org_id="acme")
    await tenancy.publish(tenancy.acme, "mq.delay.org.acme.work", control)
    [msg] = await tenancy.read("TASKS", 1)
    assert json.loads(msg.data)["id"] == control["id"]
    conn = await asyncpg.connect(tenancy.database_url)
    try:
        rows = await conn.fetch("SELECT original_id, reason, error FROM dead_letters")
    finally:
        await conn.close()
    assert [(r["original_id"], r["reason"]) for r in rows] == [(claimed["id"], "org_mismatch")]


async def test_the_daemon_turns_the_lanes_window_off_under_its_user(tenancy: Tenancy) -> None:
    """The `scheduler` user may create and seal the lane's empty source stream and give the
    lane no duplicate window (nats-server 2.14+; older servers keep 100 ms and a warning); a
    producer can neither publish into that stream nor change the lane."""
    daemon = tenancy.runner.daemon
    assert daemon is not None and daemon.bus is not None
    lane = await tenancy.ops.nc.jetstream().stream_info("MQ_DELAY")
    if daemon.bus.can_disable_dedup():
        assert not lane.config.duplicate_window
        assert [s.name for s in lane.config.sources or []] == ["MQ_DELAY_NODEDUP"]
        assert not [w for w in daemon.warnings if "duplicate window" in w]
    else:
        assert lane.config.duplicate_window == 0.1
    nc = tenancy.acme.nc
    await nc.publish("MQ_DELAY_NODEDUP", b"x")
    await tenancy.acme.wait_denied("MQ_DELAY_NODEDUP")
    await nc.publish("$JS.API.STREAM.UPDATE.MQ_DELAY", b"{}")
    await tenancy.acme.wait_denied("$JS.API.STREAM.UPDATE.MQ_DELAY")
    assert tenancy.server.violations("scheduler") == []
