"""What the baseline gate costs: a clean compare run and a save, against a plain run.

A user's test times a small GPT-style model's DDP step with ``ddp_step_timer`` on 2 gloo
ranks.  Each block runs pytest three times in fresh processes, in turn:

* plain: no baseline file (``no baseline``: nothing is re-measured);
* save: ``--distperf-save`` into a fresh folder;
* compare: against that save, nothing changed (the re-measure loop runs as the rule asks).

The script prints each run's wall time, the load of the machine during it (1-minute load
average before and after), and the medians and ranges of compare/plain and save/plain.
``--model 4x256``: a GPT of 4 blocks of width 256 (about 1 s a step on a CPU rank here, 20
steps as a user's test would take), the size of issue 49's save-cost case.

    PYTHONPATH=. python benchmarks/gate_cost.py --blocks 6 --json /tmp/gate_cost.json
    PYTHONPATH=. python benchmarks/gate_cost.py --model 4x256 --blocks 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TEST = '''
import pytest
import torch
from torch import nn

# 2 ranks time-sliced on a shared machine: only a gross imbalance should fail here
pytestmark = pytest.mark.distperf(max_imbalance=1.5, max_comm_overhead=0.6)

WIDTH, HEADS, BLOCKS, VOCAB, SEQ, BATCH = SHAPE


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.wpe = nn.Embedding(SEQ, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, BLOCKS)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens):
        """The next-token loss of ``tokens`` (the step's loss is its output)."""
        idx, targets = tokens[:, :-1], tokens[:, 1:]
        pos = torch.arange(idx.shape[1])
        mask = nn.Transformer.generate_square_subsequent_mask(idx.shape[1])
        x = self.blocks(self.wte(idx) + self.wpe(pos), mask=mask, is_causal=True)
        logits = self.head(x)
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def make_model():
    torch.manual_seed(0)
    return GPT()


def make_batch(rank):
    g = torch.Generator().manual_seed(rank)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def test_gpt_step(ddp_step_timer):
    timing = ddp_step_timer(make_model, make_batch, steps=STEPS, warmup=3)
    assert timing.step_time_s > 0
'''
#: (width, heads, blocks, vocabulary, sequence + 1, batch rows per rank) and steps per model
MODELS = {"small": ((128, 4, 2, 512, 65, 8), 10), "4x256": ((256, 4, 4, 4096, 257, 8), 20)}


def load() -> float:
    return os.getloadavg()[0]


def run_pytest(folder: Path, baselines: Path, *extra: str) -> tuple[float, float, float, int]:
    """Wall seconds of one pytest run, the load before and after, and its exit code."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--distperf",
           "--gpus", "2", "--distperf-baselines", str(baselines), str(folder / "test_gpt.py"),
           *extra]
    before = load()
    start = time.perf_counter()
    done = subprocess.run(cmd, check=False, cwd=folder, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-2000:], sep="\n")
    return wall, before, load(), done.returncode


def measurements_of(report: Path) -> dict[str, int]:
    """How many measurements the save took of each timed metric, from its JSON report."""
    try:
        tests = json.loads(report.read_text())["tests"]
    except (OSError, ValueError, KeyError):
        return {}
    return {v["metric"]: v["measurement_count"] for t in tests for v in t["verdicts"]
            if v["metric"] in ("step_time_s", "compute_time_s")}


def summary(ratios: list[float]) -> str:
    return (f"median {statistics.median(ratios):.2f}x "
            f"(range {min(ratios):.2f}-{max(ratios):.2f}x, {len(ratios)} blocks)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--model", choices=sorted(MODELS), default="small",
                        help="small (default): 2 x 128, ~20 ms a step; 4x256: ~1 s a step")
    args = parser.parse_args()
    shape, steps = MODELS[args.model]
    rows = []
    with tempfile.TemporaryDirectory(prefix="gate-cost-") as tmp:
        folder = Path(tmp)
        (folder / "test_gpt.py").write_text(f"SHAPE, STEPS = {shape!r}, {steps}\n" + TEST)
        for block in range(args.blocks):
            base = folder / f"baselines{block}"
            plain = run_pytest(folder, folder / f"empty{block}")
            report = folder / f"save{block}.json"
            save = run_pytest(folder, base, "--distperf-save", f"--distperf-json={report}")
            compare = run_pytest(folder, base)
            row = {"block": block, "plain": plain, "save": save, "compare": compare,
                   "save_measurements": measurements_of(report)}
            rows.append(row)
            print(f"block {block}: " + ", ".join(
                f"{kind} {r[0]:.1f} s (load {r[1]:.1f}->{r[2]:.1f}, rc {r[3]})"
                for kind, r in (("plain", plain), ("save", save), ("compare", compare)))
                + f"; the save's measurements: {row['save_measurements']}", flush=True)
    compare_ratio = [r["compare"][0] / r["plain"][0] for r in rows]
    save_ratio = [r["save"][0] / r["plain"][0] for r in rows]
    print(f"compare / plain: {summary(compare_ratio)}")
    print(f"save / plain:    {summary(save_ratio)}")
    print(f"plain run: median {statistics.median(r['plain'][0] for r in rows):.1f} s")
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows, "compare_ratio": compare_ratio,
                                         "save_ratio": save_ratio}, indent=1))


if __name__ == "__main__":
    main()
