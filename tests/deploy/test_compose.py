"""deploy/compose.yaml: valid under the Compose specification's JSON schema and to docker-compose
itself (no engine runs here), and the same deployment as the chart's."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from scheduler.durations import parse_duration
from tests.deploy.conftest import ROOT, Manifests, env_of, one
from tests.support import tools

COMPOSE = ROOT / "deploy" / "compose.yaml"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text()))


@pytest.fixture(scope="module")
def resolved() -> dict[str, Any]:
    """The file as docker-compose resolves it (anchors merged, variables interpolated)."""
    proc = subprocess.run(
        [
            str(tools.docker_compose()),
            "-f",
            str(COMPOSE),
            "--profile",
            "audit",
            "config",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def test_compose_file_is_valid_under_the_compose_spec_schema(compose: dict[str, Any]) -> None:
    """The file validates against the Compose specification's JSON schema; a misspelt key does
    not."""
    schema = json.loads(tools.compose_schema().read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(compose)]
    assert not errors, errors
    broken = json.loads(json.dumps(compose))
    broken["services"]["scheduler"]["replica"] = 2
    assert not validator.is_valid(broken)


def test_docker_compose_accepts_it(resolved: dict[str, Any]) -> None:
    """`docker-compose config` resolves it: the services, volumes and the audit profile."""
    assert set(resolved["services"]) == {"nats", "postgres", "migrate", "scheduler", "audit"}
    assert set(resolved["volumes"]) == {"nats-data", "postgres-data", "audit-reports"}


def test_production_server_versions_as_the_compat_run_tests(resolved: dict[str, Any]) -> None:
    """NATS is the 2.10 release the compatibility run tests, with JetStream; PostgreSQL is 15."""
    nats = resolved["services"]["nats"]
    version = tools.NATS_COMPAT_PYPI.split("==")[1]
    assert nats["image"].startswith(f"nats:{version}")
    assert "--jetstream" in nats["command"]
    assert re.fullmatch(r"postgres:15\.\d+[\w.-]*", resolved["services"]["postgres"]["image"])
    for name in ("nats", "postgres"):
        assert resolved["services"][name]["healthcheck"]["test"]


def test_migration_runs_first_then_two_replicas(resolved: dict[str, Any]) -> None:
    """`scheduler migrate` runs once PostgreSQL is healthy; two scheduler replicas start only
    after it completed successfully and both servers are healthy."""
    services = resolved["services"]
    assert services["migrate"]["command"] == ["migrate"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    scheduler = services["scheduler"]
    assert scheduler["command"] == ["run"]
    assert scheduler["deploy"]["replicas"] == 2
    conditions = {k: v["condition"] for k, v in scheduler["depends_on"].items()}
    assert conditions == {
        "nats": "service_healthy",
        "postgres": "service_healthy",
        "migrate": "service_completed_successfully",
    }
    assert services["audit"]["profiles"] == ["audit"]


def test_scheduler_settings_match_the_charts(
    resolved: dict[str, Any], default_manifests: Manifests
) -> None:
    """The settings the chart gives the daemon have the same values in Compose, and Compose's stop
    grace exceeds the shutdown grace as the pod's does."""
    env = resolved["services"]["scheduler"]["environment"]
    chart_env = env_of(
        one(default_manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    )
    for name in (
        "SCHEDULER_HTTP_HOST",
        "SCHEDULER_SCHEDULES_DIR",
        "SCHEDULER_SHUTDOWN_GRACE",
        "SCHEDULER_LOG_FORMAT",
    ):
        assert env[name] == chart_env[name]["value"], name
    assert env["SCHEDULER_NATS_URL"] == "nats://nats:4222"
    assert env["SCHEDULER_DATABASE_URL"].startswith("postgresql://scheduler:")
    assert env["SCHEDULER_DATABASE_URL"].endswith("@postgres:5432/scheduler")
    grace = parse_duration(env["SCHEDULER_SHUTDOWN_GRACE"]).total_seconds()
    stop = parse_duration(resolved["services"]["scheduler"]["stop_grace_period"]).total_seconds()
    assert stop > grace
    mounts = {v["target"]: v for v in resolved["services"]["scheduler"]["volumes"]}
    schedules = mounts[env["SCHEDULER_SCHEDULES_DIR"]]
    assert schedules["read_only"] and Path(schedules["source"]) == ROOT / "schedules"


@pytest.mark.parametrize("service", ["migrate", "scheduler", "audit"])
def test_our_containers_are_hardened_as_in_the_chart(
    resolved: dict[str, Any], service: str
) -> None:
    """Our containers run as uid 10001 on a read-only root with /tmp in memory, no capabilities
    and no privilege gain, from the Dockerfile target each needs."""
    s = resolved["services"][service]
    assert s["user"] == "10001:10001"
    assert s["read_only"] is True and s["tmpfs"] == ["/tmp"]
    assert s["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in s["security_opt"]
    assert Path(s["build"]["context"]) == ROOT
    assert s["build"]["target"] == ("audit" if service == "audit" else "daemon")
