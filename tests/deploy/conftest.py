"""Fixtures of the deploy checks: the tools (tests/support/tools.py) and the chart rendered by
helm."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import tools

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "mq-scheduler"
HA_VALUES = CHART / "ci" / "ha-values.yaml"

Manifests = list[dict[str, Any]]
Render = Callable[..., Manifests]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "deploy" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.deploy)


@pytest.fixture(scope="session")
def helm() -> Path:
    return tools.helm()


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="session")
def render(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> Render:
    """render(*values_files, values=dict, **helm_flags) -> the manifests `helm template` prints."""
    tmp = tmp_path_factory.mktemp("values")

    def render_(*files: Path, values: dict[str, Any] | None = None) -> Manifests:
        args = ["template", "rel", str(CHART), "--namespace", "sched"]
        for f in files:
            args += ["-f", str(f)]
        if values is not None:
            extra = tmp / f"v{len(list(tmp.iterdir()))}.yaml"
            extra.write_text(yaml.safe_dump(values))
            args += ["-f", str(extra)]
        proc = run_helm(helm, *args)
        if proc.returncode != 0:
            raise HelmError(proc.stderr)
        return [d for d in yaml.safe_load_all(proc.stdout) if d]

    return render_


class HelmError(Exception):
    """helm refused to render; the message is its stderr."""


@pytest.fixture(scope="session")
def default_manifests(render: Render) -> Manifests:
    return render()


@pytest.fixture(scope="session")
def ha_manifests(render: Render) -> Manifests:
    return render(HA_VALUES)


def one(manifests: Manifests, kind: str, name_suffix: str = "") -> dict[str, Any]:
    """The single object of `kind` (whose name ends with `name_suffix`)."""
    found = [
        m for m in manifests if m["kind"] == kind and m["metadata"]["name"].endswith(name_suffix)
    ]
    assert len(found) == 1, f"{len(found)} {kind} objects named *{name_suffix}"
    return found[0]


def kinds(manifests: Manifests) -> list[str]:
    return sorted(m["kind"] for m in manifests)


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}
