"""A quiet SparkSession for the audit: Spark's own console output goes to a log file.

`local[*]` by default with `SPARK_LOCAL_IP=127.0.0.1`; any master by option; under
`spark-submit` the session that spark-submit configured (its master wins unless `--master` is
given). The JVM's stdout and stderr go to `log_path`, so the console shows only the audit's own
progress lines; a failure points at that file.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.console.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yyyy-MM-dd HH:mm:ss} %p %c{1}: %m%n
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
"""
DEFAULT_CONF = {
    "spark.app.name": "mq-scheduler-audit",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "16",
    "spark.sql.adaptive.enabled": "true",
    # the expansion hands over Arrow batches of up to 65,536 occurrences
    "spark.sql.execution.arrow.maxRecordsPerBatch": "65536",
}


def loopback_master(master: str) -> bool:
    """True for local masters and for cluster masters on a loopback address."""
    if master.startswith("local"):
        return True
    host = urlparse(master).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


def _quiet_python_loggers() -> None:
    # py4j logs every connection it closes at INFO, even from finalizers at interpreter exit;
    # PySpark 4 logs each analysis error it raises as JSON on stderr, also those we handle
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        from pyspark.logger import PySparkLogger
    except ImportError:  # PySpark 3.5 has neither logger
        return
    for name in ("DataFrameQueryContextLogger", "SQLQueryContextLogger"):
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL + 1)


def _log4j_file() -> Path:
    path = Path(tempfile.gettempdir()) / "mq-scheduler-audit-log4j2.properties"
    if not path.is_file() or path.read_text() != LOG4J2:
        path.write_text(LOG4J2)
    return path


def start(
    master: str | None,
    jars: list[str],
    log_path: Path,
    conf: dict[str, str] | None = None,
) -> tuple[Any, bool]:
    """(SparkSession, whether we started it). An active session in this process is reused."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    _quiet_python_loggers()
    active = SparkSession.getActiveSession()  # per thread; the context is per process
    if active is None and SparkContext._active_spark_context is not None:
        active = SparkSession.builder.getOrCreate()
    if active is not None:
        return active, False
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    chosen = master or (None if under_submit else "local[*]")
    if chosen is not None and loopback_master(chosen):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark_conf = SparkConf()
    for key, value in {**DEFAULT_CONF, **(conf or {})}.items():
        spark_conf.set(key, value)
    if chosen is not None:
        spark_conf.setMaster(chosen)
    if jars:
        spark_conf.set("spark.jars", ",".join(jars))
    if under_submit:
        session = SparkSession.builder.config(conf=spark_conf).getOrCreate()
    else:
        options = f"-Dlog4j2.configurationFile=file:{_log4j_file()}"
        spark_conf.set("spark.driver.extraJavaOptions", options)
        spark_conf.set("spark.executor.extraJavaOptions", options)
        gateway = _gateway(spark_conf, log_path)
        session = SparkSession(SparkContext(conf=spark_conf, gateway=gateway))
    session.sparkContext.setLogLevel("ERROR")
    return session, True


def _gateway(conf: Any, log_path: Path) -> Any:
    from pyspark.java_gateway import launch_gateway

    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:  # the child keeps its own copy of the descriptor
        return launch_gateway(conf, popen_kwargs={"stdout": log, "stderr": log})
