"""The chart's pods run as rendered, without a cluster: each container's args and env (secrets
resolved, mounts mapped to folders) start the real process against real NATS and PostgreSQL.

The migration Job migrates an empty database; the daemon answers its readiness, liveness and
metrics probes on the ports the chart gives it, loads the schedules ConfigMap, and a SIGTERM
ends it inside the pod's termination grace, preStop wait included."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
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
    """A pod's single container as a local process: secrets from a dict, ConfigMap volumes
    written to folders, every mount path in env values mapped to its folder."""

    def __init__(
        self,
        pod: dict[str, Any],
        secrets: dict[tuple[str, str], str],
        configmaps: dict[str, dict[str, str]],
        root: Path,
    ) -> None:
        (self.container,) = pod["containers"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        self.mounts: dict[str, Path] = {}
        for mount in self.container.get("volumeMounts", []):
            folder = root / mount["name"]
            folder.mkdir(parents=True, exist_ok=True)
            source = volumes[mount["name"]]
            if "configMap" in source:
                for name, text in configmaps[source["configMap"]["name"]].items():
                    (folder / name).write_text(text)
            self.mounts[mount["mountPath"]] = folder
        self.env = {"PATH": os.environ["PATH"], "HOME": str(root)}
        for entry in self.container.get("env", []):
            self.env[entry["name"]] = self._value(entry, secrets)
        self.log = root / "container.log"

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
        get = self.container[name]["httpGet"]
        ports = {p["name"]: p["containerPort"] for p in self.container["ports"]}
        port = ports.get(get["port"], get["port"])
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{get['path']}", timeout=2) as r:
                return int(r.status)
        except OSError:
            return 0


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
    """The Job's `migrate` brings an empty database to head; the Deployment's container then
    starts, passes its startup, readiness and liveness probes, serves metrics, loads the
    schedules from the ConfigMap, and a SIGTERM ends it inside the termination grace."""
    http, metrics = free_port(), free_port()
    values = {
        "nats": {"url": nats_url},
        "containerPorts": {"http": http, "metrics": metrics},
        "api": {"tokens": {"existingSecret": "api"}},
        "config": {"lease_ttl": 3},
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
    run = PodRun(pod, secrets, configmaps, tmp_path / "daemon")
    proc = run.start()
    try:
        await wait_for(lambda: run.probe("startupProbe") == 200, 30, proc, run.log)
        await wait_for(lambda: run.probe("readinessProbe") == 200, 30, proc, run.log)
        assert run.probe("livenessProbe") == 200
        assert b"mq_scheduler_build_info" in await asyncio.to_thread(fetch, metrics, "/metrics")
        await wait_for(lambda: '"cron.synced jobs=1' in run.log.read_text(), 15, proc, run.log)
        grace = pod["terminationGracePeriodSeconds"]
        pre_stop = int(run.container["lifecycle"]["preStop"]["exec"]["command"][1])
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, grace - pre_stop)
        assert code == 0, run.log.read_text()[-3000:]
        assert time.monotonic() - started < grace - pre_stop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


JOB = """\
  - name: pod-check
    subject: mq.scheduled.podcheck
    cron: "0 3 * * *"
"""
