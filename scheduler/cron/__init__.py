"""Cron, pure: expressions and their occurrences (DST included), the `scheduled_jobs` YAML and
its job model, misfire policies. No I/O."""
