"""The drift audit (docs/drift-audit.md): did every cron occurrence fire once, on time, and did
every delayed task go out when it was due?

`scheduler audit` reads a day of the execution log (`fire_log`: JSON lines, Parquet or JDBC),
expands each cron job's expected occurrences on the Spark executors with the daemon's own cron
code, joins the two and writes Parquet tables, `summary.json` and `report.html`.
`scheduler export-log` writes a day of `fire_log` as JSON lines or Parquet.

Modules: `window` (the audited interval), `expected` (occurrences, pure), `inputs` (reading the
log), `job` (the run and its stages), `transforms` (the Spark transforms), `handovers` (the
terms that fired each partition and their handovers), `summary` (counts to `summary.json`, the
SLO verdict), `report`, `handover_report` and `markup` (HTML), `session` (a quiet
SparkSession), `export` (export-log), `cli`. Nothing here imports PySpark at module import time
except `job`, `inputs` and `session`, which only the audit command loads.
"""
