#!/usr/bin/env bash
# Run every benchmark at the sizes the issues name; JSON to bench/results/, summaries to stderr.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/results
for b in accuracy burst intake scale cron; do
  .venv/bin/python "bench/$b.py" "$@" > "bench/results/$b.json" || true
done
