#!/usr/bin/env bash
# The plugin's test suite beside a CPU-bound neighbour busy on one core for the whole run
# (issue 32): `bash benchmarks/busy_suite.sh [RUNS] [pytest args, default: tests]`; figures
# in benchmarks/suite.md.
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
shift || true
[ $# -gt 0 ] || set -- tests
python -c "while True: pass" &
neighbour=$!
trap 'kill $neighbour 2>/dev/null' EXIT
passed=0
for run in $(seq "$runs"); do
    start=$(date +%s)
    if python -m pytest -q -p no:cacheprovider "$@" > "/tmp/busy_suite.$run.log" 2>&1; then
        passed=$((passed + 1)); outcome=passed
    else
        outcome=FAILED
    fi
    echo "run $run: $outcome in $(( $(date +%s) - start )) s: $(tail -1 "/tmp/busy_suite.$run.log")"
done
echo "$passed of $runs runs passed beside a busy neighbour (logs: /tmp/busy_suite.N.log)"
[ "$passed" -eq "$runs" ]
