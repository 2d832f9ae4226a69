#!/usr/bin/env bash
# Every GPU check in one go, for a lent GPU machine (benchmarks/gpu.md says what it showed):
# benchmarks/gpu_check.py, then the examples (saved, then compared) and the health-check
# suite at --gpus 1. Wheels in .whl/ (tomli-w, HTA) are installed first where present.
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
GPUS=${GPUS:-1}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
timeout "${CHECK_S:-200}" python3 benchmarks/gpu_check.py --out "$OUT/gpu" 2>&1 \
    | tee "$OUT/gpu_check.log"
# the plugin by its entry point where installed, else by name
PLUGIN=$(python3 -c "import importlib.metadata as m
print('' if any(e.name == 'distperf' for e in m.entry_points(group='pytest11'))
      else '-p pytest_distperf.plugin')")
run() { timeout 100 python3 -m pytest $PLUGIN -p no:cacheprovider \
    --distperf --gpus "$GPUS" --distperf-baselines /tmp/baselines "$@"; }
{
    echo "== examples, saved"; run examples/ -q --distperf-save
    echo "== examples, compared"; run examples/ -rA --distperf-json "$OUT/examples.json" \
        --distperf-markdown "$OUT/examples.md"
    echo "== examples, compared again"; run examples/ -q
    echo "== the health-check suite"; run --pyargs pytest_distperf.suite -q
} 2>&1 | tee "$OUT/pytest.log"
