"""Where the audit writes: a local folder, or any URL Spark's file systems know (s3a://...).

Spark writes the Parquet tables itself; the small files (summary.json, run.json, report.html)
go through Python for a local folder and through the session's Hadoop FileSystem for a URL.
Spark's own log always stays on local disk: in the folder, or in a temp dir for a URL.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Output:
    """The `--out` location."""

    location: str

    @property
    def remote(self) -> bool:
        return "://" in self.location

    def path(self, name: str) -> str:
        """Where `name` goes, as Spark and the messages spell it."""
        return f"{self.location.rstrip('/')}/{name}"

    @property
    def spark_log(self) -> Path:
        if not self.remote:
            return Path(self.location) / "spark.log"
        return Path(tempfile.gettempdir()) / "mq-scheduler-audit" / "spark.log"

    def prepare(self) -> None:
        if not self.remote:
            Path(self.location).mkdir(parents=True, exist_ok=True)

    def write_text(self, spark: Any, name: str, text: str) -> None:
        """Write one small file (UTF-8), replacing it."""
        if not self.remote:
            (Path(self.location) / name).write_text(text, encoding="utf-8")
            return
        jvm = spark.sparkContext._jvm
        target = jvm.org.apache.hadoop.fs.Path(self.path(name))
        fs = target.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        stream = fs.create(target, True)
        try:
            stream.write(bytearray(text.encode("utf-8")))
        finally:
            stream.close()

    def __str__(self) -> str:
        return self.location
