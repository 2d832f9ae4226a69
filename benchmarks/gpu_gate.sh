#!/usr/bin/env bash
# Issue 47's proof on a lent GPU machine (benchmarks/gpu.md says how to run it and what it
# showed): benchmarks/gpu_gate.py on nanoGPT's GPT-2 small, within TOTAL_S (default 350 s).
# Wheels in .whl/ (tomli-w: the save writes TOML) are installed first; pytest_distperf is this
# working tree's (on PYTHONPATH), so what is proved is the commit that travelled.
#   GPT=.gate/model.py GPT_SOURCE="karpathy/nanoGPT model.py at <commit>" \
#       OUT=/tmp/gate bash benchmarks/gpu_gate.sh [more gpu_gate.py options]
# Files under OUT: gpu_gate.json, gpu_gate.md, gpu_gate.log.
set -u
OUT=${OUT:-/tmp/gpu-gate-out}
TOTAL_S=${TOTAL_S:-350}
GPT=${GPT:-.gate/model.py}
mkdir -p "$OUT"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -c "import tomli_w" || { echo "tomli-w is missing: carry its wheel in .whl/"; exit 1; }
# the script stops itself at its budget; timeout is the backstop 20 s later
left=$(( TOTAL_S - SECONDS - 10 ))
timeout $(( left + 20 )) python3 benchmarks/gpu_gate.py --gpt "$GPT" \
    --gpt-source "${GPT_SOURCE:-}" --budget "$left" --out "$OUT" "$@" 2>&1 \
    | tee "$OUT/gpu_gate.log"
echo "== gpu_gate.sh: $SECONDS s"
