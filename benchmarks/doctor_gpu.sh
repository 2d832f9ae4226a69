#!/usr/bin/env bash
# The runner check on a GPU machine (docs/runner.md): NCCL, one rank per GPU (GPUS, default
# 1), the full configuration; the page to stdout and $OUT/doctor.log, the JSON report (the
# page under sections.runner_check) to $OUT/runner_check.json. Wheels in .whl/ (tomli-w,
# nvidia-ml-py) are installed first where present. The check stays within TOTAL_S (default
# 150 s: under 3 minutes with the start).
set -u
OUT=${OUT:-/tmp/doctor-out}
TOTAL_S=${TOTAL_S:-150}
GPUS=${GPUS:-1}
mkdir -p "$OUT"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,power.default_limit,ecc.errors.uncorrected.volatile.total --format=csv
# the plugin by its entry point where installed, else by name
PLUGIN=$(python3 -c "import importlib.metadata as m
print('' if any(e.name == 'distperf' for e in m.entry_points(group='pytest11'))
      else '-p pytest_distperf.plugin')")
# shellcheck disable=SC2086  # PLUGIN is empty or two words
timeout "$TOTAL_S" python3 -m pytest $PLUGIN -p no:cacheprovider -q --durations=0 \
    --pyargs pytest_distperf.doctor --distperf --gpus "$GPUS" \
    --distperf-json "$OUT/runner_check.json" 2>&1 | tee "$OUT/doctor.log"
echo "== doctor_gpu.sh: $SECONDS s"
