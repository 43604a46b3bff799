"""The Helm chart: lint, offline schema validation, and what the rendered objects say."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.settings import Settings
from tests.deploy.conftest import (
    CHART,
    HA_VALUES,
    ROOT,
    HelmError,
    Manifests,
    Render,
    env_of,
    kinds,
    one,
    run_helm,
)

KUBE_VERSIONS = ["1.27.0", "1.37.0"]  # the chart's kubeVersion floor and the newest schemas
SECRET_ENV = {
    "SCHEDULER_DATABASE_URL",
    "SCHEDULER_NATS_USER",
    "SCHEDULER_NATS_PASSWORD",
    "SCHEDULER_NATS_TOKEN",
    "SCHEDULER_ADMIN_TOKEN",
    "SCHEDULER_READ_TOKEN",
    "AUDIT_JDBC_URL",
}
# Settings the chart sets from values of its own (or secrets), so they are not under `config`.
CHART_MANAGED_SETTINGS = {
    "nats_url",
    "nats_creds",
    "nats_user",
    "nats_password",
    "nats_tls_ca",
    "nats_token",
    "nats_nkey_seed",
    "nats_tls_cert",
    "nats_tls_key",
    "database_url",
    "database_password_file",
    "admin_token",
    "read_token",
    "schedules_dir",
    "instance_id",
    "http_host",
    "http_port",
    "metrics_port",
    "shutdown_grace",
    "log_level",
    "log_format",
    "data_dir",  # embedded mode only
    "run_dir",  # the daemon pod's shared folder of the engine and the edge
}


DAEMON = "rel-mq-scheduler"  # the daemon Deployment's name (the edge-only one ends in -edge)
RUN_DIR = "/run/mq-scheduler"


def daemon_pod(manifests: Manifests) -> dict[str, Any]:
    return dict(one(manifests, "Deployment", DAEMON)["spec"]["template"]["spec"])


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    (c,) = [c for c in pod["containers"] if c["name"] == name]
    return dict(c)


def engine_container(manifests: Manifests) -> dict[str, Any]:
    """The daemon pod's engine: leadership, intake, firing, cron; no port."""
    return container(daemon_pod(manifests), "engine")


def edge_container(manifests: Manifests) -> dict[str, Any]:
    """The daemon pod's edge: the API, console, /metrics and NATS verbs beside the engine."""
    return container(daemon_pod(manifests), "edge")


def edge_pod(manifests: Manifests) -> dict[str, Any]:
    return dict(one(manifests, "Deployment", "-edge")["spec"]["template"]["spec"])


def daemon_containers(manifests: Manifests) -> list[dict[str, Any]]:
    """Every container that runs `scheduler run`: the daemon pods' two, the edge-only pods'."""
    found = list(daemon_pod(manifests)["containers"])
    if any(m["metadata"]["name"].endswith("-edge") for m in manifests if m["kind"] == "Deployment"):
        found += edge_pod(manifests)["containers"]
    return found


def audit_pod(manifests: Manifests) -> dict[str, Any]:
    job: dict[str, Any] = one(manifests, "CronJob")["spec"]["jobTemplate"]
    spec: dict[str, Any] = job["spec"]["template"]["spec"]
    return spec


# -- helm's own checks and offline validation ------------------------------------------------


@pytest.mark.parametrize("values", [None, HA_VALUES], ids=["default", "ha"])
def test_helm_lint_strict_passes(helm: Path, values: Path | None) -> None:
    """`helm lint --strict` finds nothing to warn about with the default and the HA values."""
    args = ["lint", "--strict", str(CHART)] + (["-f", str(values)] if values else [])
    proc = run_helm(helm, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout


@pytest.mark.parametrize("values", [None, HA_VALUES], ids=["default", "ha"])
def test_rendered_manifests_pass_kubernetes_validate_strict(
    helm: Path, values: Path | None, tmp_path: Path
) -> None:
    """Every rendered core object validates strictly (no unknown field) against the Kubernetes
    schemas of the chart's oldest and the newest supported version; only the Prometheus
    Operator's two CRDs are unknown to it."""
    args = ["template", "rel", str(CHART), "-n", "sched"] + (["-f", str(values)] if values else [])
    rendered = run_helm(helm, *args)
    assert rendered.returncode == 0, rendered.stderr
    manifest = tmp_path / "rendered.yaml"
    manifest.write_text(rendered.stdout)
    validator = Path(sys.executable).with_name("kubernetes-validate")
    for version in KUBE_VERSIONS:
        proc = subprocess.run(
            [str(validator), "--strict", "-k", version, str(manifest)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = (proc.stdout + proc.stderr).splitlines()
        assert proc.returncode == 0, "\n".join(lines)
        unchecked = [ln for ln in lines if not ln.startswith("INFO") or "passed" not in ln]
        assert all("PrometheusRule" in ln or "ServiceMonitor" in ln for ln in unchecked), "\n".join(
            unchecked
        )
        assert sum("passed" in ln for ln in lines) >= (11 if values else 9)


def test_kubernetes_validate_strict_catches_a_misspelt_field(
    render: Render, tmp_path: Path
) -> None:
    """The offline validation is not a formality: a misspelt field passed through extraEnv is
    reported."""
    manifests = render(values={"extraEnv": [{"name": "X", "vaule": "1"}]})
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(yaml.safe_dump(one(manifests, "Deployment", DAEMON)))
    validator = Path(sys.executable).with_name("kubernetes-validate")
    proc = subprocess.run(
        [str(validator), "--strict", "-k", KUBE_VERSIONS[0], str(manifest)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "vaule" in proc.stdout + proc.stderr


# -- the Deployment -------------------------------------------------------------------------


def test_deployment_runs_two_hot_standby_replicas_that_roll_without_a_gap(
    default_manifests: Manifests, ha_manifests: Manifests
) -> None:
    """Two replicas by default (three in the HA values); a rollout surges one new replica before
    an old one stops."""
    deploy = one(default_manifests, "Deployment")
    assert deploy["spec"]["replicas"] == 2
    assert one(ha_manifests, "Deployment", DAEMON)["spec"]["replicas"] == 3
    rolling = deploy["spec"]["strategy"]["rollingUpdate"]
    assert (rolling["maxSurge"], rolling["maxUnavailable"]) == (1, 0)
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert deploy["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_probes_ports_and_the_settings_the_daemon_needs_in_a_pod(
    default_manifests: Manifests,
) -> None:
    """The edge: readiness on /readyz and liveness on /healthz of the API port; 8055 and 9090
    exposed; the API binds all interfaces and each replica is named after its pod."""
    c = edge_container(default_manifests)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8055, "metrics": 9090}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    env = env_of(c)
    assert env["SCHEDULER_HTTP_HOST"]["value"] == "0.0.0.0"
    assert env["SCHEDULER_HTTP_PORT"]["value"] == "8055"
    assert env["SCHEDULER_METRICS_PORT"]["value"] == "9090"
    assert env["SCHEDULER_INSTANCE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["SCHEDULER_SCHEDULES_DIR"]["value"] == "/etc/mq-scheduler/schedules"
    assert c["args"] == ["run", "--role", "edge"]


def test_every_setting_the_chart_sets_is_one_the_daemon_reads(ha_manifests: Manifests) -> None:
    """Each SCHEDULER_* variable in every daemon and edge container names a real setting, so
    none is silently ignored."""
    fields = {f"SCHEDULER_{name.upper()}" for name in Settings.model_fields}
    containers = daemon_containers(ha_manifests)
    assert [c["name"] for c in containers] == ["engine", "edge", "edge"]
    for c in containers:
        names = set(env_of(c))
        assert {n for n in names if n.startswith("SCHEDULER_")} <= fields
        assert {"SCHEDULER_LEASE_TTL", "SCHEDULER_TARGET_ALLOW"} <= names


def test_config_values_become_scheduler_variables(ha_manifests: Manifests) -> None:
    """`config` keys become SCHEDULER_<KEY>; a list is joined with commas as the daemon reads it."""
    env = env_of(engine_container(ha_manifests))
    assert env["SCHEDULER_LEASE_TTL"]["value"] == "5"
    assert env["SCHEDULER_TARGET_ALLOW"]["value"] == "mq.>,jobs.>"
    assert env["SCHEDULER_INTENT_TTL"]["value"] == "12h"
    settings = Settings(
        lease_ttl=env["SCHEDULER_LEASE_TTL"]["value"],
        target_allow=env["SCHEDULER_TARGET_ALLOW"]["value"],
        intent_ttl=env["SCHEDULER_INTENT_TTL"]["value"],
        intent_max_per_target=env["SCHEDULER_INTENT_MAX_PER_TARGET"]["value"],
        instance_id="t",
    )
    assert settings.target_allow == ["mq.>", "jobs.>"]
    assert settings.intent_ttl.total_seconds() == 12 * 3600
    assert settings.intent_max_per_target == 50_000


def test_shutdown_is_bounded_inside_the_pods_grace(default_manifests: Manifests) -> None:
    """The edge's preStop wait plus the SIGTERM handover (SCHEDULER_SHUTDOWN_GRACE) end before
    the kubelet's SIGKILL; the engine has no preStop wait (it hands the lease over at once)."""
    deploy = one(default_manifests, "Deployment")
    c = edge_container(default_manifests)
    assert "lifecycle" not in engine_container(default_manifests)
    grace = int(env_of(c)["SCHEDULER_SHUTDOWN_GRACE"]["value"].removesuffix("s"))
    pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert deploy["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > grace + int(
        pre_stop[1]
    )
    assert grace == 20


def test_a_termination_grace_shorter_than_the_handover_is_refused(render: Render) -> None:
    """terminationGracePeriodSeconds at or below preStop + shutdown grace fails the render with a
    message naming both."""
    with pytest.raises(HelmError, match=r"terminationGracePeriodSeconds .*must exceed"):
        render(values={"terminationGracePeriodSeconds": 25})
    assert (
        one(render(values={"terminationGracePeriodSeconds": 60}), "Deployment")["spec"]["template"][
            "spec"
        ]["terminationGracePeriodSeconds"]
        == 60
    )


def test_replicas_spread_across_nodes_and_zones(
    default_manifests: Manifests, ha_manifests: Manifests
) -> None:
    """Topology spread over zones and nodes on the pod's own labels: soft by default (a one-node
    cluster still runs both), hard across three zones in the HA values."""
    for manifests, hard in ((default_manifests, False), (ha_manifests, True)):
        spec = one(manifests, "Deployment", DAEMON)["spec"]
        constraints = {
            c["topologyKey"]: c for c in spec["template"]["spec"]["topologySpreadConstraints"]
        }
        assert set(constraints) == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
        for c in constraints.values():
            assert c["maxSkew"] == 1
            assert c["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]
            expected = "DoNotSchedule" if hard else "ScheduleAnyway"
            assert c["whenUnsatisfiable"] == expected
        assert constraints["topology.kubernetes.io/zone"].get("minDomains") == (3 if hard else None)


@pytest.mark.parametrize("which", ["daemon", "edge", "migrate", "audit"])
def test_pods_run_non_root_read_only_without_privileges(
    ha_manifests: Manifests, which: str
) -> None:
    """Daemon (both containers), edge-only, migration and audit pods: non-root, read-only root
    with an emptyDir /tmp, no privilege escalation, every capability dropped, seccomp
    RuntimeDefault."""
    pods: dict[str, Callable[[], dict[str, Any]]] = {
        "daemon": lambda: daemon_pod(ha_manifests),
        "edge": lambda: edge_pod(ha_manifests),
        "migrate": lambda: one(ha_manifests, "Job")["spec"]["template"]["spec"],
        "audit": lambda: audit_pod(ha_manifests),
    }
    pod = pods[which]()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    assert len(pod["containers"]) == (2 if which == "daemon" else 1)
    for c in pod["containers"]:
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["privileged"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert "emptyDir" in volumes[mounts["/tmp"]]
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]


# -- the two roles: an engine and an edge per daemon pod, edge-only pods -------------------


def test_daemon_pod_runs_an_engine_and_an_edge_beside_it(default_manifests: Manifests) -> None:
    """Two containers of the same image: the engine (`run --role engine`) and the edge
    (`run --role edge`), the engine first."""
    pod = daemon_pod(default_manifests)
    assert [(c["name"], c["args"]) for c in pod["containers"]] == [
        ("engine", ["run", "--role", "engine"]),
        ("edge", ["run", "--role", "edge"]),
    ]
    assert len({c["image"] for c in pod["containers"]}) == 1


@pytest.mark.parametrize("values", ["default", "ha", "auth", "audit"])
def test_engine_and_edge_take_the_same_env_and_mounts(
    render: Render, default_manifests: Manifests, ha_manifests: Manifests, values: str
) -> None:
    """Same settings, secrets, env from extraEnvFrom and mounts in both containers (a pair must
    agree on everything, the instance id included), whatever the values turn on."""
    made: dict[str, Callable[[], Manifests]] = {
        "default": lambda: default_manifests,
        "ha": lambda: ha_manifests,
        "auth": lambda: render(
            values={**AUTH_VALUES, "extraEnvFrom": [{"secretRef": {"name": "x"}}]}
        ),
        "audit": lambda: render(
            values={
                "audit": {"output": {"pvc": {"mountInDaemons": True}}},
                "extraEnv": [{"name": "X", "value": "1"}],
            }
        ),
    }
    manifests = made[values]()
    engine, edge = engine_container(manifests), edge_container(manifests)
    assert engine["env"] == edge["env"]
    assert engine.get("envFrom") == edge.get("envFrom")
    assert engine["volumeMounts"] == edge["volumeMounts"]
    assert engine["securityContext"] == edge["securityContext"]
    instance = env_of(engine)["SCHEDULER_INSTANCE_ID"]["valueFrom"]["fieldRef"]
    assert instance == {"fieldPath": "metadata.name"}


def test_the_pair_shares_a_small_in_memory_run_folder(default_manifests: Manifests) -> None:
    """SCHEDULER_RUN_DIR names the mount of the `run` volume in both containers: an emptyDir in
    memory with a small size limit (engine.json and engine.prom only), writable by both."""
    pod = daemon_pod(default_manifests)
    (run,) = [v for v in pod["volumes"] if v["name"] == "run"]
    assert run["emptyDir"]["medium"] == "Memory"
    assert run["emptyDir"]["sizeLimit"] == "16Mi"
    for c in pod["containers"]:
        assert env_of(c)["SCHEDULER_RUN_DIR"]["value"] == RUN_DIR
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == "run"]
        assert mount["mountPath"] == RUN_DIR and not mount.get("readOnly")


def test_the_engine_has_no_port_and_an_exec_probe(default_manifests: Manifests) -> None:
    """The engine opens no port (nothing an outsider sends reaches it): no ports, no HTTP probe,
    no readiness probe (the edge's /readyz includes it); its startup and liveness probes run
    `scheduler probe engine`, with the probes' periods and thresholds and a timeout of its own."""
    engine = engine_container(default_manifests)
    assert "ports" not in engine
    assert "readinessProbe" not in engine
    edge = edge_container(default_manifests)
    for name in ("startupProbe", "livenessProbe"):
        probe = engine[name]
        assert probe["exec"] == {"command": ["scheduler", "probe", "engine"]}
        assert "httpGet" not in probe
        assert probe["timeoutSeconds"] == 5
        for key in ("periodSeconds", "failureThreshold"):
            assert probe[key] == edge[name][key], (name, key)


def test_probes_can_be_turned_off_in_both_containers(render: Render) -> None:
    """startupProbe/livenessProbe/readinessProbe.enabled=false drop the probe from each
    container that has it; engine.probeTimeoutSeconds sets the exec probes' timeout."""
    off = {"enabled": False}
    manifests = render(values={"startupProbe": off, "livenessProbe": off, "readinessProbe": off})
    for c in daemon_pod(manifests)["containers"]:
        assert not {"startupProbe", "livenessProbe", "readinessProbe"} & set(c), c["name"]
    slow = engine_container(render(values={"engine": {"probeTimeoutSeconds": 9}}))
    assert slow["livenessProbe"]["timeoutSeconds"] == slow["startupProbe"]["timeoutSeconds"] == 9


def test_resources_are_the_engines_and_edge_resources_the_edges(render: Render) -> None:
    """`resources` keeps meaning what it did (the container that fires), `edge.resources` sizes
    every edge container, in the daemon pods and the edge-only pods."""
    engine_res = {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}
    edge_res = {"requests": {"cpu": "300m", "memory": "200Mi"}, "limits": {"memory": "300Mi"}}
    manifests = render(
        values={"resources": engine_res, "edge": {"replicaCount": 1, "resources": edge_res}}
    )
    assert engine_container(manifests)["resources"] == engine_res
    assert edge_container(manifests)["resources"] == edge_res
    assert container(edge_pod(manifests), "edge")["resources"] == edge_res


def test_no_edge_only_deployment_by_default(default_manifests: Manifests) -> None:
    """edge.replicaCount defaults to 0: the daemon Deployment is the only one."""
    names = [m["metadata"]["name"] for m in default_manifests if m["kind"] == "Deployment"]
    assert names == [DAEMON]


def test_edge_only_pods_run_the_edge_alone(render: Render) -> None:
    """With edge.replicaCount the `-edge` Deployment runs that many pods of one container: the
    daemon pod's edge without the run folder (an edge alone), same settings otherwise, its own
    selector; the daemon Deployment's selector is unchanged (immutable on upgrade)."""
    manifests = render(values={"edge": {"replicaCount": 3}})
    deploy = one(manifests, "Deployment", "-edge")
    assert deploy["metadata"]["name"] == "rel-mq-scheduler-edge"
    assert deploy["spec"]["replicas"] == 3
    pod = edge_pod(manifests)
    (alone,) = pod["containers"]
    paired = edge_container(manifests)
    assert alone["args"] == ["run", "--role", "edge"]
    assert "SCHEDULER_RUN_DIR" not in env_of(alone)
    assert [e for e in paired["env"] if e["name"] != "SCHEDULER_RUN_DIR"] == alone["env"]
    assert [m for m in paired["volumeMounts"] if m["name"] != "run"] == alone["volumeMounts"]
    assert all(v["name"] != "run" for v in pod["volumes"])
    for key in ("ports", "readinessProbe", "livenessProbe", "startupProbe", "lifecycle"):
        assert alone[key] == paired[key], key
    daemon = one(manifests, "Deployment", DAEMON)
    assert daemon["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "mq-scheduler",
        "app.kubernetes.io/instance": "rel",
        "app.kubernetes.io/component": "daemon",
    }
    edge_selector = deploy["spec"]["selector"]["matchLabels"]
    assert edge_selector["app.kubernetes.io/component"] == "edge"
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert edge_selector.items() <= labels.items()
    assert not daemon["spec"]["selector"]["matchLabels"].items() <= labels.items()
    spread = pod["topologySpreadConstraints"]
    assert all(c["labelSelector"]["matchLabels"] == edge_selector for c in spread)
    assert (
        pod["terminationGracePeriodSeconds"]
        == daemon_pod(manifests)["terminationGracePeriodSeconds"]
    )


def _pod_labels(manifests: Manifests) -> dict[str, dict[str, str]]:
    """Each pod template's labels by the name of the object that makes it."""
    found = {}
    for m in manifests:
        spec = m.get("spec", {})
        if m["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        if m["kind"] == "Pod":
            found[m["metadata"]["name"]] = m["metadata"]["labels"]
        elif "template" in spec:
            found[m["metadata"]["name"]] = spec["template"]["metadata"]["labels"]
    return found


def test_service_network_policy_and_service_monitor_cover_every_edge(
    ha_manifests: Manifests,
) -> None:
    """The Service selects the daemon pods and the edge-only pods (the serves-api label) and no
    other pod of the release (migration, audit, helm test); the NetworkPolicy admits and lets
    out the same pods; the ServiceMonitor scrapes that Service, so every edge's /metrics."""
    pods = _pod_labels(ha_manifests)
    assert set(pods) == {
        DAEMON,
        "rel-mq-scheduler-edge",
        "rel-mq-scheduler-migrate",
        "rel-mq-scheduler-drift-audit",
        "rel-mq-scheduler-test-readyz",
    }
    svc = one(ha_manifests, "Service")
    np = one(ha_manifests, "NetworkPolicy", DAEMON)
    for selector in (svc["spec"]["selector"], np["spec"]["podSelector"]["matchLabels"]):
        assert selector["mq-scheduler.dev/serves-api"] == "true"
        selected = {name for name, labels in pods.items() if selector.items() <= labels.items()}
        assert selected == {DAEMON, "rel-mq-scheduler-edge"}
    sm = one(ha_manifests, "ServiceMonitor")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert "metrics" in {p["name"] for p in svc["spec"]["ports"]}
    assert {p["name"] for p in container(edge_pod(ha_manifests), "edge")["ports"]} == {
        "http",
        "metrics",
    }


# -- secrets --------------------------------------------------------------------------------


@pytest.mark.parametrize("values", ["default", "ha"])
def test_secrets_are_referenced_never_inlined(
    default_manifests: Manifests, ha_manifests: Manifests, values: str
) -> None:
    """No Secret object is rendered; every secret-bearing variable comes from a secretKeyRef and
    no rendered value holds a URL with a password or a JDBC URL."""
    manifests = default_manifests if values == "default" else ha_manifests
    assert "Secret" not in kinds(manifests)
    containers = [
        *daemon_containers(manifests),
        one(manifests, "Job")["spec"]["template"]["spec"]["containers"][0],
    ]
    containers += audit_pod(manifests)["containers"]
    seen = set()
    for c in containers:
        for name, e in env_of(c).items():
            if name in SECRET_ENV:
                seen.add(name)
                assert "value" not in e and e["valueFrom"]["secretKeyRef"]["name"], name
    assert {"SCHEDULER_DATABASE_URL", "AUDIT_JDBC_URL"} <= seen
    text = yaml.safe_dump_all(manifests)
    assert not re.search(r"postgres(ql)?://[^\s'\"]*:[^\s'\"]*@", text)
    assert "jdbc:postgresql" not in text


def test_ha_values_wire_each_secret_to_its_consumer(ha_manifests: Manifests) -> None:
    """Database URL, migration role, NATS credentials file and CA, API tokens and the audit's JDBC
    URL each come from the Secret the values name (in the engine, the edge beside it and the
    edge-only pods alike)."""

    def ref(e: dict[str, Any]) -> tuple[str, str]:
        key = e["valueFrom"]["secretKeyRef"]
        return key["name"], key["key"]

    for pod in (daemon_pod(ha_manifests), edge_pod(ha_manifests)):
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["nats-credentials"]["secret"]["secretName"] == "mq-scheduler-nats"
        assert volumes["nats-ca"]["secret"]["secretName"] == "nats-ca"
        for c in pod["containers"]:
            env = env_of(c)
            assert ref(env["SCHEDULER_DATABASE_URL"]) == ("mq-scheduler-db", "database-url")
            assert ref(env["SCHEDULER_ADMIN_TOKEN"]) == ("mq-scheduler-api", "admin-token")
            assert ref(env["SCHEDULER_READ_TOKEN"]) == ("mq-scheduler-api", "read-token")
            assert env["SCHEDULER_NATS_CREDS"]["value"] == "/etc/mq-scheduler/nats/nats.creds"
            assert env["SCHEDULER_NATS_TLS_CA"]["value"] == "/etc/mq-scheduler/tls/ca.crt"
            mounts = {m["name"]: m for m in c["volumeMounts"]}
            assert mounts["nats-credentials"]["readOnly"] and mounts["nats-ca"]["readOnly"]
    job_env = env_of(one(ha_manifests, "Job")["spec"]["template"]["spec"]["containers"][0])
    assert ref(job_env["SCHEDULER_DATABASE_URL"]) == ("mq-scheduler-db-owner", "database-url")
    audit_env = env_of(audit_pod(ha_manifests)["containers"][0])
    assert ref(audit_env["AUDIT_JDBC_URL"]) == ("mq-scheduler-audit-db", "jdbc-url")


AUTH_VALUES: dict[str, Any] = {
    "nats": {
        "nkey": {"existingSecret": "sched-nkey"},
        "tls": {"client": {"existingSecret": "sched-nats-client"}},
    },
    "database": {
        "password": {"existingSecret": "sched-db-password"},
        "tls": {"ca": {"existingSecret": "pg-ca"}},
    },
}


@pytest.mark.parametrize("migration_role", ["daemon", "owner"])
def test_nkey_client_certificate_database_password_and_ca_are_mounted_files(
    render: Render, migration_role: str
) -> None:
    """An NKey seed, a NATS client certificate, the database password and the PostgreSQL CA come
    from the Secrets named, mounted read-only, and their settings name the mounted files; the
    migration Job gets the CA, and the password only when it runs as the daemon's role."""
    values = json.loads(json.dumps(AUTH_VALUES))
    if migration_role == "owner":
        values["database"]["migration"] = {"existingSecret": "sched-db-owner"}
    manifests = render(values=values)
    pod = daemon_pod(manifests)
    volumes = {v["name"]: v["secret"] for v in pod["volumes"] if "secret" in v}
    assert volumes["nats-nkey"]["secretName"] == "sched-nkey"
    assert [i["key"] for i in volumes["nats-client-tls"]["items"]] == ["tls.crt", "tls.key"]
    assert volumes["database-password"]["secretName"] == "sched-db-password"
    assert volumes["postgres-ca"]["secretName"] == "pg-ca"
    for c in pod["containers"]:
        env = env_of(c)
        assert env["SCHEDULER_NATS_NKEY_SEED"]["value"] == "/etc/mq-scheduler/nats-nkey/nkey.seed"
        assert env["SCHEDULER_NATS_TLS_CERT"]["value"] == "/etc/mq-scheduler/nats-client/tls.crt"
        assert env["SCHEDULER_NATS_TLS_KEY"]["value"] == "/etc/mq-scheduler/nats-client/tls.key"
        assert env["SCHEDULER_DATABASE_PASSWORD_FILE"]["value"] == (
            "/etc/mq-scheduler/database-password/password"
        )
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        for name in ("nats-nkey", "nats-client-tls", "database-password", "postgres-ca"):
            assert mounts[name]["readOnly"], (c["name"], name)
    job = one(manifests, "Job")["spec"]["template"]["spec"]
    job_mounts = {m["name"] for m in job["containers"][0]["volumeMounts"]}
    job_env = env_of(job["containers"][0])
    assert "postgres-ca" in job_mounts
    as_daemon = migration_role == "daemon"
    assert ("database-password" in job_mounts) is as_daemon
    assert ("SCHEDULER_DATABASE_PASSWORD_FILE" in job_env) is as_daemon


def test_a_nats_token_comes_from_its_secret(render: Render) -> None:
    """nats.token names the Secret whose key becomes SCHEDULER_NATS_TOKEN (never a value)."""
    manifests = render(values={"nats": {"token": {"existingSecret": "sched-token"}}})
    for c in daemon_pod(manifests)["containers"]:
        ref = env_of(c)["SCHEDULER_NATS_TOKEN"]["valueFrom"]
        assert ref["secretKeyRef"] == {"name": "sched-token", "key": "token"}


# -- the values schema ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicaCount": "two"}, r"replicaCount: Invalid type. Expected: integer"),
        ({"replicaCunt": 3}, r"Additional property replicaCunt is not allowed"),
        ({"audit": {"masterUrl": "spark://x:7077"}}, r"audit: Additional property masterUrl"),
        ({"schedules": {"reload": "sometimes"}}, r"schedules.reload.*must be one of"),
        ({"database": {"url": "postgresql://u:pw@db/x"}}, r"database: Additional property url"),
        ({"config": {"database_url": "postgresql://u:pw@db/x"}}, r"config: Additional property"),
        ({"config": {"admin_token": "s3cret"}}, r"config: Additional property admin_token"),
        ({"config": {"horizon": "soon"}}, r"config.horizon"),
        ({"nats": {"url": "http://nats:4222"}}, r"nats.url: Does not match pattern"),
        ({"service": {"ports": {"http": 70000}}}, r"service.ports.http: Must be less than"),
        ({"edge": {"replicas": 2}}, r"edge: Additional property replicas is not allowed"),
        ({"edge": {"replicaCount": -1}}, r"edge.replicaCount: Must be greater than or equal"),
        ({"config": {"run_dir": "/x"}}, r"config: Additional property run_dir"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else "",
)
def test_values_schema_refuses_bad_values(
    render: Render, values: dict[str, Any], message: str
) -> None:
    """A wrong type, an unknown key (a secret written inline included) or a bad enum fails the
    render with the field named."""
    with pytest.raises(HelmError, match=message):
        render(values=values)


def test_values_schema_config_keys_are_the_daemons_settings() -> None:
    """`config` takes exactly the daemon's settings the chart does not set itself: a new setting
    must be added to the schema (and README), a removed one leaves it."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    keys = set(schema["properties"]["config"]["properties"])
    assert keys == set(Settings.model_fields) - CHART_MANAGED_SETTINGS
    assert CHART_MANAGED_SETTINGS <= set(Settings.model_fields)


def test_chart_readme_lists_every_value() -> None:
    """Each leaf of values.yaml has a row in the chart README's values table."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()
    rows = set(re.findall(r"^\| `([^`]+)` \|", readme, re.M))

    whole = {"updateStrategy", "resources", "podSecurityContext", "containerSecurityContext"}
    whole |= {"migration.resources", "audit.resources", "edge.resources"}

    def leaves(node: Any, prefix: str = "") -> list[str]:
        if isinstance(node, dict) and node and prefix.rstrip(".") not in whole:
            return [leaf for k, v in node.items() for leaf in leaves(v, f"{prefix}{k}.")]
        return [prefix.rstrip(".")]

    missing = [k for k in leaves(values) if k not in rows]
    assert not missing, f"values missing from charts/mq-scheduler/README.md: {missing}"
    unknown = rows - set(leaves(values))
    assert not unknown, f"README rows for values that do not exist: {sorted(unknown)}"


# -- migration Job --------------------------------------------------------------------------


def test_migration_job_is_a_pre_install_and_pre_upgrade_hook(
    default_manifests: Manifests,
) -> None:
    """`scheduler migrate` runs as a hook before install and upgrade, replaced on the next run,
    removed once it succeeds, bounded in time; with no migration Secret it uses the daemon's."""
    job = one(default_manifests, "Job", "-migrate")
    ann = job["metadata"]["annotations"]
    assert set(ann["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    assert int(ann["helm.sh/hook-weight"]) < 0
    assert set(ann["helm.sh/hook-delete-policy"].split(",")) == {
        "before-hook-creation",
        "hook-succeeded",
    }
    spec = job["spec"]
    assert spec["activeDeadlineSeconds"] > 0 and spec["backoffLimit"] >= 0
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert "serviceAccountName" not in pod  # the chart's does not exist yet at pre-install
    (c,) = pod["containers"]
    assert c["args"] == ["migrate"]
    assert c["image"] == engine_container(default_manifests)["image"]
    ref = env_of(c)["SCHEDULER_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "rel-mq-scheduler-database", "key": "database-url"}


def test_migration_job_can_be_turned_off(render: Render) -> None:
    """migration.enabled=false renders no Job (migrations run some other way)."""
    assert "Job" not in kinds(render(values={"migration": {"enabled": False}}))


# -- schedules ------------------------------------------------------------------------------


def test_schedules_configmap_holds_the_charts_files_and_values_files(
    ha_manifests: Manifests,
) -> None:
    """The ConfigMap carries the chart's schedules/ and the values' files, mounted read-only at
    the daemon's SCHEDULER_SCHEDULES_DIR."""
    cm = one(ha_manifests, "ConfigMap", "-schedules")
    chart_files = {p.name for p in (CHART / "schedules").glob("*.yaml")}
    assert set(cm["data"]) == chart_files | {"extra.yaml"}
    assert "hourly-compaction" in cm["data"]["extra.yaml"]
    for pod in (daemon_pod(ha_manifests), edge_pod(ha_manifests)):
        vol = next(v for v in pod["volumes"] if v["name"] == "schedules")
        assert vol["configMap"]["name"] == cm["metadata"]["name"]
        for c in pod["containers"]:
            mount = next(m for m in c["volumeMounts"] if m["name"] == "schedules")
            assert mount["mountPath"] == "/etc/mq-scheduler/schedules" and mount["readOnly"]


def test_a_schedules_change_rolls_the_pods_unless_reload_is_live(render: Render) -> None:
    """The pod template carries a checksum of the schedules, so a changed file rolls the pods;
    with reload=live it does not (the daemon's file watch picks the change up)."""

    def checksum(values: dict[str, Any]) -> str | None:
        deploy = one(render(values=values), "Deployment")
        got: str | None = (
            deploy["spec"]["template"]["metadata"].get("annotations", {}).get("checksum/schedules")
        )
        return got

    job = "scheduled_jobs:\n  - name: a\n    subject: mq.scheduled.a\n    cron: '{}'\n"
    first = checksum({"schedules": {"files": {"x.yaml": job.format("0 * * * *")}}})
    second = checksum({"schedules": {"files": {"x.yaml": job.format("5 * * * *")}}})
    assert first and second and first != second
    assert checksum({"schedules": {"reload": "live"}}) is None


def test_an_existing_configmap_replaces_the_charts(render: Render) -> None:
    """schedules.existingConfigMap mounts that ConfigMap; the chart renders none of its own."""
    manifests = render(values={"schedules": {"existingConfigMap": "team-jobs"}})
    assert "ConfigMap" not in kinds(manifests)
    pod = daemon_pod(manifests)
    assert (
        next(v for v in pod["volumes"] if v["name"] == "schedules")["configMap"]["name"]
        == "team-jobs"
    )


def test_chart_schedules_are_the_repositorys_and_valid() -> None:
    """charts/mq-scheduler/schedules/ is a copy of schedules/ (the platform's standard jobs) and
    passes `scheduler validate`."""
    repo = {p.name: p.read_text() for p in (ROOT / "schedules").glob("*.yaml")}
    chart = {p.name: p.read_text() for p in (CHART / "schedules").glob("*.yaml")}
    assert chart == repo, "copy schedules/*.yaml to charts/mq-scheduler/schedules/"
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler", "validate", str(CHART / "schedules")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- Service, PDB, NetworkPolicy ------------------------------------------------------------


def test_service_exposes_api_and_metrics_of_every_replica(default_manifests: Manifests) -> None:
    """The Service maps 8055 (http) and 9090 (metrics) onto the daemon pods, leader and standby
    (their edge container's ports)."""
    svc = one(default_manifests, "Service")
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]}
    assert ports == {"http": (8055, "http"), "metrics": (9090, "metrics")}
    deploy = one(default_manifests, "Deployment")
    assert (
        svc["spec"]["selector"].items() <= deploy["spec"]["template"]["metadata"]["labels"].items()
    )
    assert {p["name"] for p in edge_container(default_manifests)["ports"]} == {"http", "metrics"}


def test_pdb_lets_one_replica_go_at_a_time(default_manifests: Manifests) -> None:
    """The PodDisruptionBudget allows one unavailable daemon pod and selects exactly them."""
    pdb = one(default_manifests, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    deploy = one(default_manifests, "Deployment")
    assert pdb["spec"]["selector"] == deploy["spec"]["selector"]


def _rule_ports(rule: dict[str, Any]) -> set[tuple[str, Any]]:
    return {(p["protocol"], p["port"]) for p in rule["ports"]}


def test_network_policy_admits_the_two_ports_and_reaches_only_nats_postgres_and_dns(
    default_manifests: Manifests, ha_manifests: Manifests
) -> None:
    """Ingress on http and metrics only, from the release's namespace and the listed ones; egress
    to DNS (53), NATS (4222) and PostgreSQL (5432) and nothing else, to the peers given."""
    np = one(ha_manifests, "NetworkPolicy", "rel-mq-scheduler")
    selector = np["spec"]["podSelector"]["matchLabels"].items()
    for name in (DAEMON, "-edge"):  # the daemon pods and the edge-only pods
        assert (
            selector
            <= one(ha_manifests, "Deployment", name)["spec"]["template"]["metadata"][
                "labels"
            ].items()
        )
    assert set(np["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    (ingress,) = np["spec"]["ingress"]
    assert _rule_ports(ingress) == {("TCP", "http"), ("TCP", "metrics")}
    namespaces = [
        p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
        for p in ingress["from"]
        if "namespaceSelector" in p
    ]
    assert namespaces == ["monitoring", "platform-ops"]
    assert {"podSelector": {}} in ingress["from"]
    egress = np["spec"]["egress"]
    assert [_rule_ports(r) for r in egress] == [
        {("UDP", 53), ("TCP", 53)},
        {("TCP", 4222)},
        {("TCP", 5432)},
    ]
    assert egress[0]["to"][0]["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
    assert egress[1]["to"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "nats"
    }
    assert egress[2]["to"] == [{"ipBlock": {"cidr": "10.20.0.0/16"}}]
    default_egress = one(default_manifests, "NetworkPolicy", "rel-mq-scheduler")["spec"]["egress"]
    assert all("to" not in r for r in default_egress[1:])  # ports only, any destination


def test_network_policy_with_no_allowed_source_denies_all_ingress(render: Render) -> None:
    """With neither the own namespace nor any other allowed in, ingress is an empty list (deny
    all), never a rule with no peers (which would admit everyone)."""
    values = {"networkPolicy": {"ingress": {"sameNamespace": False, "namespaces": []}}}
    np = one(render(values=values), "NetworkPolicy", "rel-mq-scheduler")
    assert np["spec"]["ingress"] == []


def test_audit_network_policy_reaches_postgres_and_the_spark_cluster(
    default_manifests: Manifests, ha_manifests: Manifests
) -> None:
    """The audit pods reach DNS and PostgreSQL; with a Spark master also the Spark peers, from
    which executors may connect back to the driver."""
    local = one(default_manifests, "NetworkPolicy", "-audit")
    assert local["spec"]["ingress"] == []
    assert [_rule_ports(r) for r in local["spec"]["egress"]] == [
        {("UDP", 53), ("TCP", 53)},
        {("TCP", 5432)},
    ]
    cluster = one(ha_manifests, "NetworkPolicy", "-audit")
    spark_peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "spark"}}}
    assert cluster["spec"]["ingress"] == [{"from": [spark_peer]}]
    assert cluster["spec"]["egress"][-1] == {
        "ports": [{"protocol": "TCP", "port": 7077}],
        "to": [spark_peer],
    }


# -- Prometheus Operator objects -------------------------------------------------------------


def test_service_monitor_scrapes_the_metrics_port(
    default_manifests: Manifests, ha_manifests: Manifests
) -> None:
    """Off by default; enabled, it scrapes /metrics on the Service's metrics port in the release
    namespace, with the labels Prometheus selects on."""
    assert "ServiceMonitor" not in kinds(default_manifests)
    sm = one(ha_manifests, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert re.fullmatch(r"\d+s", endpoint["interval"])
    svc = one(ha_manifests, "Service")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"] == {"matchNames": ["sched"]}
    assert "metrics" in {p["name"] for p in svc["spec"]["ports"]}


def _rules_file() -> dict[str, Any]:
    rules: dict[str, Any] = yaml.safe_load(
        (CHART / "files" / "mq-scheduler-rules.yaml").read_text()
    )
    return rules


def test_prometheus_rule_carries_the_alert_rules_unchanged(
    default_manifests: Manifests, ha_manifests: Manifests
) -> None:
    """Off by default; enabled, its groups are the rules file's, templating braces and all."""
    assert "PrometheusRule" not in kinds(default_manifests)
    rule = one(ha_manifests, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"]["groups"] == _rules_file()["groups"]
    alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert "MqSchedulerNoLeader" in alerts and len(alerts) >= 6
    assert any("{{ $labels." in json.dumps(r) for g in rule["spec"]["groups"] for r in g["rules"])


def test_prometheus_rule_extra_groups_are_appended(render: Render) -> None:
    """prometheusRule.extraGroups follow the chart's groups."""
    extra = {"name": "team", "rules": [{"alert": "X", "expr": "vector(1)"}]}
    values = {"prometheusRule": {"enabled": True, "extraGroups": [extra]}}
    groups = one(render(values=values), "PrometheusRule")["spec"]["groups"]
    assert groups == [*_rules_file()["groups"], extra]


def test_chart_rules_are_the_canonical_rules_file() -> None:
    """The chart's copy is byte-identical to deploy/prometheus/mq-scheduler-rules.yaml (Helm
    cannot read files outside the chart)."""
    canonical = ROOT / "deploy" / "prometheus" / "mq-scheduler-rules.yaml"
    if not canonical.exists():
        pytest.skip("deploy/prometheus/mq-scheduler-rules.yaml is not in this tree yet (issue 14)")
    copy = CHART / "files" / "mq-scheduler-rules.yaml"
    assert copy.read_bytes() == canonical.read_bytes(), f"cp {canonical} {copy}"


# -- the drift-audit CronJob ----------------------------------------------------------------


def test_audit_cronjob_runs_nightly_once_at_a_time(default_manifests: Manifests) -> None:
    """Nightly in UTC, never two at once, a deadline for a late start, the audit image."""
    cron = one(default_manifests, "CronJob")["spec"]
    assert cron["schedule"] == "30 0 * * *" and cron["timeZone"] == "Etc/UTC"
    assert cron["concurrencyPolicy"] == "Forbid"
    assert cron["startingDeadlineSeconds"] > 0
    job = cron["jobTemplate"]["spec"]
    assert job["activeDeadlineSeconds"] > 0
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["containers"][0]["image"] == "mq-scheduler:0.1.0-audit"


def _audit_argv(pod: dict[str, Any], tmp_path: Path) -> list[str]:
    """Run the CronJob's shell command with a stand-in `scheduler` that prints its argv."""
    (c,) = pod["containers"]
    stub = tmp_path / "bin" / "scheduler"
    stub.parent.mkdir()
    stub.write_text(
        "#!/bin/sh\nexec python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' \"$@\"\n"
    )
    stub.chmod(0o755)
    env = {
        "PATH": f"{stub.parent}:/usr/bin:/bin",
        "AUDIT_JDBC_URL": "jdbc:postgresql://db:5432/mq?user=a&password=b c",
    }
    for name, e in env_of(c).items():
        if "value" in e:
            env[name] = e["value"]
    proc = subprocess.run(
        [*c["command"], *c["args"]], env=env, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    return list(json.loads(proc.stdout))


def test_audit_command_audits_yesterday_from_the_database_into_the_pvc(
    default_manifests: Manifests, tmp_path: Path
) -> None:
    """Run as the pod runs it, the command is `scheduler audit` for yesterday (UTC) reading the
    JDBC URL from its Secret and writing a folder per day on the PVC, in local mode."""
    from datetime import UTC, datetime, timedelta

    pod = audit_pod(default_manifests)
    argv = _audit_argv(pod, tmp_path)
    day = (datetime.now(UTC) - timedelta(days=1)).date().isoformat()
    assert argv == [
        "audit",
        "--date",
        day,
        "--input",
        "jdbc:postgresql://db:5432/mq?user=a&password=b c",
        "--schedules",
        "/etc/mq-scheduler/schedules",
        "--out",
        f"/audit/{day}",
    ]
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    claim = next(v for v in pod["volumes"] if v["name"] == mounts["/audit"])
    pvc = one(default_manifests, "PersistentVolumeClaim")
    assert claim["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_audit_on_a_cluster_master_with_extra_args(ha_manifests: Manifests, tmp_path: Path) -> None:
    """With audit.master the command passes --master, the driver binds the pod IP, and extra
    arguments follow; an existing claim is used as is."""
    pod = audit_pod(ha_manifests)
    argv = _audit_argv(pod, tmp_path)
    assert argv[-3:] == ["--master", "spark://spark-master.spark:7077", "--fail-on-slo"]
    env = env_of(pod["containers"][0])
    assert env["SPARK_LOCAL_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert "PersistentVolumeClaim" not in kinds(ha_manifests)
    assert {"name": "output", "persistentVolumeClaim": {"claimName": "drift-reports"}} in pod[
        "volumes"
    ]


def test_audit_to_an_object_store_path(render: Render, tmp_path: Path) -> None:
    """With an object-store path the report goes there (one folder per day) and no PVC is made."""
    manifests = render(values={"audit": {"output": {"objectStorePath": "s3a://reports/drift/"}}})
    assert "PersistentVolumeClaim" not in kinds(manifests)
    pod = audit_pod(manifests)
    argv = _audit_argv(pod, tmp_path)
    assert argv[argv.index("--out") + 1].startswith("s3a://reports/drift/20")
    assert all(v["name"] != "output" for v in pod["volumes"])


def test_daemons_can_read_the_audit_reports(render: Render) -> None:
    """With audit.output.pvc.mountInDaemons the daemon pods mount the audit's claim read-only
    at /audit and SCHEDULER_AUDIT_DIR points there (the console's drift page); by default they
    don't, and an explicit config.audit_dir is left alone."""
    assert "SCHEDULER_AUDIT_DIR" not in env_of(edge_container(render()))
    pvc = {"enabled": True, "mountInDaemons": True, "accessModes": ["ReadWriteMany"]}
    manifests = render(values={"audit": {"output": {"pvc": pvc}}})
    container = edge_container(manifests)  # the console and GET /v1/audits are the edge's
    assert env_of(container)["SCHEDULER_AUDIT_DIR"] == {
        "name": "SCHEDULER_AUDIT_DIR",
        "value": "/audit",
    }
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/audit")
    assert mount["readOnly"] is True
    assert engine_container(manifests)["volumeMounts"] == container["volumeMounts"]
    pod = daemon_pod(manifests)
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    claim = one(manifests, "PersistentVolumeClaim")
    assert volume["persistentVolumeClaim"] == {
        "claimName": claim["metadata"]["name"],
        "readOnly": True,
    }
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    own = render(values={"audit": {"output": {"pvc": pvc}}, "config": {"audit_dir": "/elsewhere"}})
    env = [e for e in edge_container(own)["env"] if e["name"] == "SCHEDULER_AUDIT_DIR"]
    assert env == [{"name": "SCHEDULER_AUDIT_DIR", "value": "/elsewhere"}]
    to_store = render(
        values={"audit": {"output": {"pvc": pvc, "objectStorePath": "s3a://reports/drift"}}}
    )
    assert "SCHEDULER_AUDIT_DIR" not in env_of(edge_container(to_store))


def test_audit_can_be_turned_off(render: Render) -> None:
    """audit.enabled=false renders no CronJob, PVC or audit NetworkPolicy."""
    manifests = render(values={"audit": {"enabled": False}})
    assert not {"CronJob", "PersistentVolumeClaim"} & set(kinds(manifests))
    assert [m["metadata"]["name"] for m in manifests if m["kind"] == "NetworkPolicy"] == [
        "rel-mq-scheduler"
    ]


# -- helm test and NOTES ---------------------------------------------------------------------


def test_helm_test_pod_asks_the_service_for_readyz(default_manifests: Manifests) -> None:
    """`helm test` runs a hook pod that fetches /readyz through the Service."""
    pod = one(default_manifests, "Pod", "-test-readyz")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    command = " ".join(pod["spec"]["containers"][0]["command"])
    assert "http://rel-mq-scheduler:8055/readyz" in command


def test_install_notes_name_the_secrets_to_create(helm: Path, tmp_path: Path) -> None:
    """The NOTES after an install list each Secret the release refers to, and how to find the
    leader. (Rendered through `tpl` in a copy of the chart: `helm template` skips NOTES.txt and
    `helm install --dry-run` wants a cluster.)"""
    chart = tmp_path / "mq-scheduler"
    shutil.copytree(CHART, chart)
    (chart / "notes.txt").write_text((CHART / "templates" / "NOTES.txt").read_text())
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\ndata:\n  notes: |\n"
        '{{ tpl (.Files.Get "notes.txt") . | indent 4 }}\n'
    )
    args = ["template", "rel", str(chart), "-n", "sched", "-f", str(HA_VALUES)]
    proc = run_helm(helm, *args, "--show-only", "templates/zz-notes.yaml")
    assert proc.returncode == 0, proc.stderr
    notes = yaml.safe_load(proc.stdout)["data"]["notes"]
    for secret in (
        "mq-scheduler-db",
        "mq-scheduler-db-owner",
        "mq-scheduler-nats",
        "mq-scheduler-api",
    ):
        assert f"Secret {secret} " in notes
    assert "/v1/leader" in notes and "spark://spark-master.spark:7077" in notes


def test_open_mode_allows_the_services_names_as_hosts(render: Render) -> None:
    """Without API tokens the daemon answers only allowed Host names (DNS rebinding guard), so
    the chart allows the Service's names; with tokens (any Host is served) or an explicit
    config.api_allowed_hosts it sets nothing of its own."""
    env = env_of(edge_container(render()))["SCHEDULER_API_ALLOWED_HOSTS"]["value"]
    names = env.split(",")
    assert names[0] == "rel-mq-scheduler" and "rel-mq-scheduler.sched.svc" in names
    tokens = render(values={"api": {"tokens": {"existingSecret": "api-tokens"}}})
    assert "SCHEDULER_API_ALLOWED_HOSTS" not in env_of(edge_container(tokens))
    own = render(values={"config": {"api_allowed_hosts": "sched.example.com"}})
    env_list = [e for e in edge_container(own)["env"] if e["name"] == "SCHEDULER_API_ALLOWED_HOSTS"]
    assert env_list == [{"name": "SCHEDULER_API_ALLOWED_HOSTS", "value": "sched.example.com"}]
