#!/usr/bin/env bash
# Every GPU check in one go, for a lent GPU machine (benchmarks/gpu.md says what it showed):
# benchmarks/gpu_check.py, benchmarks/gpu_bench_diag.py (why bench reads less than a
# hand-written loop), then the examples (saved, then compared) and the health-check suite at
# --gpus 1. Wheels in .whl/ (tomli-w, HTA) are installed first where present.
# The whole script stays within TOTAL_S (default 405 s: under 7 minutes): each step's time
# limit is cut to what is left, and a step with under 15 s left is skipped.
set -u
OUT=${OUT:-/tmp/gpu-out}
TOTAL_S=${TOTAL_S:-405}
mkdir -p "$OUT"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
GPUS=${GPUS:-1}
# limit LIMIT: the smaller of LIMIT and the seconds left of TOTAL_S
limit() { local left=$(( TOTAL_S - SECONDS )); echo $(( $1 < left ? $1 : left )); }
# within LIMIT CMD...: CMD under `timeout`, or skipped when under 15 s are left
within() {
    local t; t=$(limit "$1"); shift
    if [ "$t" -lt 15 ]; then echo "== skipped ($SECONDS s of $TOTAL_S s spent): $*"; return 0; fi
    timeout "$t" "$@"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
within "${CHECK_S:-200}" python3 benchmarks/gpu_check.py --out "$OUT/gpu" 2>&1 \
    | tee "$OUT/gpu_check.log"
within "${DIAG_S:-150}" python3 benchmarks/gpu_bench_diag.py --out "$OUT/diag" 2>&1 \
    | tee "$OUT/gpu_bench_diag.log"
# the plugin by its entry point where installed, else by name
PLUGIN=$(python3 -c "import importlib.metadata as m
print('' if any(e.name == 'distperf' for e in m.entry_points(group='pytest11'))
      else '-p pytest_distperf.plugin')")
# shellcheck disable=SC2086  # PLUGIN is empty or two words
run() { within 100 python3 -m pytest $PLUGIN -p no:cacheprovider \
    --distperf --gpus "$GPUS" --distperf-baselines /tmp/baselines "$@"; }
{
    echo "== examples, saved"; run examples/ -q --distperf-save
    echo "== examples, compared"; run examples/ -rA --distperf-json "$OUT/examples.json" \
        --distperf-markdown "$OUT/examples.md"
    echo "== examples, compared again"; run examples/ -q
    echo "== the health-check suite"; run --pyargs pytest_distperf.suite -q
} 2>&1 | tee "$OUT/pytest.log"
echo "== gpu_run.sh: $SECONDS s"
