"""The alert rules and the Grafana dashboard in deploy/: promtool checks the rules and runs
their unit tests; every metric they query is one the daemon exports; every alert has a runbook
in docs/operations.md and a firing case in the promtool tests."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy/prometheus/mq-scheduler-rules.yaml"
RULE_TESTS = ROOT / "deploy/prometheus/mq-scheduler-rules.test.yaml"
DASHBOARD = ROOT / "deploy/grafana/mq-scheduler.json"
OPERATIONS = ROOT / "docs/operations.md"
METRIC = re.compile(r"\b((?:mq_scheduler|process|python)_[a-z0-9_]+)")


@pytest.fixture(scope="session")
def promtool() -> str:
    """promtool's path: on PATH, cached, or fetched once by scripts/promtool (Debian package)."""
    done = subprocess.run(
        [str(ROOT / "scripts/promtool"), "--path"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _run(promtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT
    )


def exported() -> set[str]:
    """Every sample name the daemon's registry can produce."""
    names: set[str] = set()
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
    for family in Metrics().registry.collect():
        names |= {family.name + s for s in suffixes.get(family.type, [""])}
        names |= {s.name for s in family.samples}
    return names


def alerts() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


def test_promtool_checks_the_rules(promtool: str) -> None:
    """`promtool check rules` accepts the file and finds every rule."""
    done = _run(promtool, "check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout


def test_promtool_unit_tests_of_the_rules_pass(promtool: str) -> None:
    """`promtool test rules` runs the synthetic-series cases and all of them pass."""
    done = _run(promtool, "test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_issue_s_alerts_exist_and_each_has_a_runbook_and_a_firing_case() -> None:
    """Every alert the operations surface promises exists, carries severity and a runbook link
    that resolves to a heading in docs/operations.md, and fires in some promtool case."""
    names = {rule["alert"] for rule in alerts()}
    assert names >= {
        "MqSchedulerNoLeader",
        "MqSchedulerTwoLeaders",
        "MqSchedulerLatenessHigh",
        "MqSchedulerStalled",
        "MqSchedulerIntakeLagging",
        "MqSchedulerDeadLettersAccumulating",
        "MqSchedulerDuplicateWindowShort",
        "MqSchedulerLeaseRenewSlow",
    }
    headings = {
        re.sub(r"[^a-z0-9-]", "", line.lstrip("#").strip().lower().replace(" ", "-"))
        for line in OPERATIONS.read_text().splitlines()
        if line.startswith("#")
    }
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing = {
        check["alertname"]
        for case in cases
        for check in case["alert_rule_test"]
        if check.get("exp_alerts")
    }
    for rule in alerts():
        assert rule["labels"]["severity"] in {"critical", "warning"}
        anchor = rule["annotations"]["runbook"].split("#", 1)[1]
        assert anchor in headings, f"{rule['alert']}: no heading #{anchor} in operations.md"
        assert rule["alert"] in firing, f"{rule['alert']} fires in no promtool case"


def test_rules_query_only_metrics_the_daemon_exports() -> None:
    """Every metric name in an alert expression is one the daemon's registry produces."""
    known = exported()
    for rule in alerts():
        used = set(METRIC.findall(rule["expr"]))
        assert used, rule["alert"]
        assert used <= known, f"{rule['alert']}: unknown {sorted(used - known)}"


def test_every_dashboard_panel_queries_metrics_the_daemon_exports() -> None:
    """Each panel of the Grafana dashboard has queries, and each names exported metrics only."""
    known = exported()
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(panels) >= 10
    for panel in panels:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            used = set(METRIC.findall(target["expr"]))
            assert used, f"{panel['title']}: {target['expr']}"
            assert used <= known, f"{panel['title']}: unknown {sorted(used - known)}"
    assert any("mq_scheduler_due_tasks" in t["expr"] for p in panels for t in p["targets"])
