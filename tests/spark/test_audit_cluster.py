"""The audit on a real Spark standalone cluster (a master and a worker started here on
127.0.0.1), through `scheduler audit --master` and through `spark-submit`: the same
summary.json as on local[*]."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from scheduler.daemon.embedded import free_port, wait_for_port
from tests.spark.conftest import audit_synth
from tests.support.synth import generate

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DAY = date(2026, 3, 29)


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


class Cluster:
    """`spark-class ...deploy.master.Master` and `...deploy.worker.Worker` on 127.0.0.1."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.port, self.ui = free_port(), free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_WORKER_DIR": str(work / "worker"),
            # one core per application unless it asks for more: the worker's two cores run
            # the test's two cluster audits side by side instead of one after the other
            "SPARK_MASTER_OPTS": "-Dspark.deploy.defaultCores=1",
        }

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _launch(self, name: str, *args: str) -> None:
        log = open(self.work / f"{name}.log", "wb")
        command = [str(spark_home() / "bin" / "spark-class"), *args]
        self.procs.append(
            subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        )
        log.close()

    def start(self) -> Cluster:
        master = "org.apache.spark.deploy.master.Master"
        self._launch(
            master.rsplit(".", 1)[1],
            master,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui),
        )
        wait_for_port("127.0.0.1", self.port, timeout=60)
        worker = "org.apache.spark.deploy.worker.Worker"
        self._launch(
            worker.rsplit(".", 1)[1],
            worker,
            "--host",
            "127.0.0.1",
            "--webui-port",
            str(free_port()),
            "--cores",
            "2",
            "--memory",
            "1g",
            self.url,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.alive_workers() >= 1:
                return self
            time.sleep(0.3)
        raise AssertionError(f"no worker registered with {self.url} within 60 s")

    def alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=2) as resp:
                doc = json.loads(resp.read())
        # while starting, a master once answered /json/ with an HTML page (busy host, -n 2)
        except (OSError, json.JSONDecodeError):
            return 0
        return sum(1 for w in doc.get("workers", []) if w.get("state") == "ALIVE")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    spark = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield spark.start()
    finally:
        spark.stop()  # also when start() failed: its master and worker would outlive the run


def audit_process(command: list[str], out: Path) -> dict[str, Any]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary


def test_standalone_cluster_gives_the_same_summary_as_local(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    """The same DST-day log audited on local[*] (in-process), on the standalone cluster with
    --master spark://127.0.0.1:PORT, and through spark-submit to that cluster: one summary."""
    synth = generate(DAY, jobs=10, tasks=800, seed=21)
    local = audit_synth(synth, tmp_path)
    assert local.code == 0, local.stderr
    common = [
        "--date",
        DAY.isoformat(),
        "--input",
        str(tmp_path / "log"),
        "--schedules",
        str(tmp_path / "schedules"),
    ]
    by_cli = [
        sys.executable,
        "-m",
        "scheduler",
        "audit",
        *common,
        "--master",
        cluster.url,
        "--out",
        str(tmp_path / "cluster"),
    ]
    by_submit = [
        str(spark_home() / "bin" / "spark-submit"),
        "--master",
        cluster.url,
        "--conf",
        "spark.ui.enabled=false",
        str(
            Path(str(__import__("scheduler.audit.__main__").__file__)).parent
            / "audit"
            / "__main__.py"
        ),
        *common,
        "--out",
        str(tmp_path / "submitted"),
    ]
    # the two applications at once, a core each (SPARK_MASTER_OPTS above): each mostly waits
    # for its JVMs to start, and they took 4.5 min one after the other on a busy host
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        cli = pool.submit(audit_process, by_cli, tmp_path / "cluster")
        submit = pool.submit(audit_process, by_submit, tmp_path / "submitted")
        on_cluster, submitted = cli.result(), submit.result()
    assert on_cluster == local.summary
    assert submitted == local.summary
    run = json.loads((tmp_path / "cluster" / "run.json").read_text())
    assert run["master"] == cluster.url
    assert json.loads((tmp_path / "submitted" / "run.json").read_text())["master"] == cluster.url
