"""Cron, pure: expressions and their occurrences, the YAML jobs, misfire policies, the plan of a
tick."""
