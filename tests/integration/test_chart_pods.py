"""The chart's pods run as rendered, without a cluster: each container's args and env (secrets
resolved, mounts mapped to folders, a pod's volumes shared by its containers) start the real
process against real NATS and PostgreSQL.

The migration Job migrates an empty database; the daemon pod's two containers start as the
kubelet starts them: the engine (no port; its exec probe reads the run folder) and the edge
beside it, which answers the readiness, liveness and metrics probes on the ports the chart
gives it for both; the engine loads the schedules ConfigMap and leads; a SIGTERM to each (the
edge's after its preStop wait) ends both inside the pod's termination grace."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml

from scheduler.daemon.embedded import free_port
from tests.deploy.conftest import CHART
from tests.support import tools

POD_NAME = "rel-mq-scheduler-7d9c-x2x"
DATABASE_SECRET = ("rel-mq-scheduler-database", "database-url")


def render(values: dict[str, Any], tmp_path: Path) -> list[dict[str, Any]]:
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(values))
    proc = subprocess.run(
        [str(tools.helm()), "template", "rel", str(CHART), "-n", "sched", "-f", str(file)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def pod_of(manifests: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (obj,) = [m for m in manifests if m["kind"] == kind]
    return dict(obj["spec"]["template"]["spec"])


class PodRun:
    """One container of a pod as a local process: secrets from a dict, ConfigMap volumes
    written to folders, every mount path in env values mapped to its folder. A volume is one
    folder under the pod's `root`, so the containers of one pod share it (an emptyDir)."""

    def __init__(
        self,
        pod: dict[str, Any],
        secrets: dict[tuple[str, str], str],
        configmaps: dict[str, dict[str, str]],
        root: Path,
        name: str | None = None,
    ) -> None:
        containers = [c for c in pod["containers"] if name is None or c["name"] == name]
        (self.container,) = containers
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        self.mounts: dict[str, Path] = {}
        for mount in self.container.get("volumeMounts", []):
            folder = root / "volumes" / mount["name"]
            folder.mkdir(parents=True, exist_ok=True)
            source = volumes[mount["name"]]
            if "configMap" in source:
                for name, text in configmaps[source["configMap"]["name"]].items():
                    (folder / name).write_text(text)
            self.mounts[mount["mountPath"]] = folder
        self.env = {"PATH": os.environ["PATH"], "HOME": str(root)}
        for entry in self.container.get("env", []):
            self.env[entry["name"]] = self._value(entry, secrets)
        self.log = root / f"{self.container['name']}.log"

    def _value(self, entry: dict[str, Any], secrets: dict[tuple[str, str], str]) -> str:
        if "value" in entry:
            value = str(entry["value"])
            for path, folder in self.mounts.items():
                if value.startswith(path):
                    value = str(folder) + value[len(path) :]
            return value
        source = entry["valueFrom"]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            return secrets[(ref["name"], ref["key"])]
        assert source["fieldRef"]["fieldPath"] == "metadata.name"
        return POD_NAME

    def start(self) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "scheduler", *self.container["args"]]
        with open(self.log, "ab") as out:
            return subprocess.Popen(cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def probe(self, name: str) -> int:
        """The probe's outcome: an HTTP status (0: no answer), or an exec probe's exit code
        mapped to 200 (0) and 0 (anything else), run in the container's env."""
        if "exec" in self.container[name]:
            command = self.container[name]["exec"]["command"]
            assert command[0] == "scheduler"  # the image's entry point
            argv = [sys.executable, "-m", "scheduler", *command[1:]]
            timeout = self.container[name]["timeoutSeconds"]
            try:
                done = subprocess.run(argv, env=self.env, capture_output=True, timeout=timeout)
            except subprocess.TimeoutExpired:  # the kubelet counts a timeout as a failure
                return 0
            return 200 if done.returncode == 0 else 0
        get = self.container[name]["httpGet"]
        ports = {p["name"]: p["containerPort"] for p in self.container["ports"]}
        port = ports.get(get["port"], get["port"])
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{get['path']}", timeout=2) as r:
                return int(r.status)
        except OSError:
            return 0


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (its socket inodes in /proc/net/tcp*, LISTEN)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def readyz(port: int) -> dict[str, Any]:
    """The /readyz body, whether 200 or 503 (an empty dict when nothing answers)."""
    try:
        return dict(json.loads(fetch(port, "/readyz")))
    except urllib.error.HTTPError as exc:
        return dict(json.loads(exc.read()))
    except OSError:
        return {}


def fetch(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
        return bytes(resp.read())


@pytest.fixture
async def empty_database(pg_admin_dsn: str) -> Any:
    """A database with no schema at all (the hook Job's first install)."""
    name = f"mqs_pod_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(pg_admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        base, _, query = pg_admin_dsn.partition("?")
        yield base.rpartition("/")[0] + f"/{name}" + (f"?{query}" if query else "")
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def wait_for(predicate: Any, within: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    async with asyncio.timeout(within):
        while not await asyncio.to_thread(predicate):
            if proc.poll() is not None:
                tail = (await asyncio.to_thread(log.read_text))[-3000:]
                raise AssertionError(f"exited {proc.returncode}:\n{tail}")
            await asyncio.sleep(0.1)


async def test_migration_job_then_daemon_pod_run_as_the_chart_renders_them(
    nats_url: str, empty_database: str, tmp_path: Path
) -> None:
    """The Job's `migrate` brings an empty database to head; the Deployment's pod then starts
    its engine and its edge on a shared run folder: the engine listens on no port and passes its
    exec startup and liveness probes, the edge its startup, readiness and liveness probes with the
    engine's role in /readyz and the engine's metrics beside its own; the engine loads the
    schedules from the ConfigMap, and SIGTERMs (the edge's after its preStop wait) end both
    inside the termination grace."""
    http, metrics = free_port(), free_port()
    values = {
        "nats": {"url": nats_url},
        "containerPorts": {"http": http, "metrics": metrics},
        "api": {"tokens": {"existingSecret": "api"}},
        "config": {"lease_ttl": 3, "metrics_export_interval": "200ms"},
        "preStopSleepSeconds": 1,
        "schedules": {"fromChart": False, "files": {"team.yaml": "scheduled_jobs:\n" + JOB}},
    }
    manifests = render(values, tmp_path)
    secrets = {
        DATABASE_SECRET: empty_database,
        ("api", "admin-token"): "a" * 32,
        ("api", "read-token"): "r" * 32,
    }
    (cm,) = [m for m in manifests if m["kind"] == "ConfigMap"]
    configmaps = {cm["metadata"]["name"]: cm["data"]}

    job = PodRun(pod_of(manifests, "Job"), secrets, configmaps, tmp_path / "job")
    done = await asyncio.to_thread(lambda: job.start().wait(60))
    assert done == 0, job.log.read_text()
    conn = await asyncpg.connect(empty_database)
    try:
        assert await conn.fetchval("SELECT version_num FROM alembic_version")
    finally:
        await conn.close()

    pod = pod_of(manifests, "Deployment")
    assert [c["name"] for c in pod["containers"]] == ["engine", "edge"]
    engine = PodRun(pod, secrets, configmaps, tmp_path / "pod", "engine")
    edge = PodRun(pod, secrets, configmaps, tmp_path / "pod", "edge")
    run_dir = Path(engine.env["SCHEDULER_RUN_DIR"])
    assert run_dir == Path(edge.env["SCHEDULER_RUN_DIR"])
    assert await asyncio.to_thread(run_dir.is_dir)
    assert await asyncio.to_thread(engine.probe, "livenessProbe") == 0  # no status yet
    procs = [engine.start(), edge.start()]
    try:
        e_proc, g_proc = procs
        await wait_for(lambda: edge.probe("startupProbe") == 200, 30, g_proc, edge.log)
        await wait_for(lambda: engine.probe("startupProbe") == 200, 30, e_proc, engine.log)
        await wait_for(lambda: edge.probe("readinessProbe") == 200, 30, g_proc, edge.log)
        assert await asyncio.to_thread(engine.probe, "livenessProbe") == 200
        assert await asyncio.to_thread(edge.probe, "livenessProbe") == 200
        assert await asyncio.to_thread(listening_ports, e_proc.pid) == set()
        assert {http, metrics} <= await asyncio.to_thread(listening_ports, g_proc.pid)
        seen: dict[str, Any] = {}

        def leads() -> bool:
            seen.update(readyz(http))
            return bool(seen.get("role") == "leader" and seen.get("ready"))

        await wait_for(leads, 15, e_proc, engine.log)
        assert seen["roles"]["engine"]["ready"] is True
        assert seen["roles"]["engine"]["pid"] == e_proc.pid
        await wait_for(
            lambda: b'role="engine"' in fetch(metrics, "/metrics"), 15, e_proc, engine.log
        )
        scraped = await asyncio.to_thread(fetch, metrics, "/metrics")
        assert b"mq_scheduler_build_info" in scraped and b'role="edge"' in scraped
        await wait_for(
            lambda: '"cron.synced jobs=1' in engine.log.read_text(), 15, e_proc, engine.log
        )
        grace = pod["terminationGracePeriodSeconds"]
        pre_stop = int(edge.container["lifecycle"]["preStop"]["exec"]["command"][1])
        assert "lifecycle" not in engine.container
        started = time.monotonic()
        e_proc.send_signal(signal.SIGTERM)  # no preStop: the engine hands over at once
        await asyncio.sleep(pre_stop)
        g_proc.send_signal(signal.SIGTERM)
        codes = await asyncio.to_thread(lambda: [p.wait(grace - pre_stop) for p in procs])
        assert codes == [0, 0], engine.log.read_text()[-2000:] + edge.log.read_text()[-2000:]
        assert time.monotonic() - started < grace
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


JOB = """\
  - name: pod-check
    subject: mq.scheduled.podcheck
    cron: "0 3 * * *"
"""
