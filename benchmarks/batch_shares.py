"""Batch shares close the loop: a rank made slower per sample, its imbalance, the advised
shares, and the imbalance with them (docs/metrics.md, "Rebalancing with batch shares").

On one rank pool (gloo, CPU, 2 ranks) the model sleeps ``--ms`` per sample in forward on rank
0 and twice that on rank 1, over a global batch of ``--rows`` rows.  Each round times

* ``even``: ``batch_shares=[0.5, 0.5]``, the batch split evenly: rank 1 takes twice as long,
  and the imbalance finding advises shares (``batch_shares=[...]`` in its suggestion);
* ``pasted``: the advised shares, pasted;
* ``auto``: ``batch_shares="auto"``: calibration steps on an even split, then the shares
  they give; its ``imbalance_before``, ``shares_used`` and ``imbalance``.

    python benchmarks/batch_shares.py                 # 3 rounds
    python benchmarks/batch_shares.py --rounds 1 --ms 2
"""

from __future__ import annotations

import argparse
import ast
import datetime
import platform
import time
from typing import Any

ROWS = 24
MS_PER_SAMPLE = 4.0


def per_sample_model(ms: float) -> Any:
    """A linear layer behind a sleep of ``ms`` per sample on rank 0, twice that on rank 1."""
    import torch
    import torch.distributed as dist

    class PerSample(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 4)

        def forward(self, x: Any) -> Any:
            slow = 2 if dist.get_rank() == 1 else 1
            time.sleep(slow * ms / 1e3 * x.shape[0])
            return self.lin(x)

    return PerSample()


def round_of(timer: Any, rows: int, ms: float, steps: int) -> dict[str, Any]:
    import torch

    def model() -> Any:
        return per_sample_model(ms)

    def batch(rank: int) -> Any:
        return torch.randn(rows, 8, generator=torch.Generator().manual_seed(1))

    run = {"steps": steps, "warmup": 2, "control": False, "count_collectives": False}
    even = timer(model, batch, batch_shares=[0.5, 0.5], **run)
    (finding,) = [b for b in even.bottlenecks if b.kind == "imbalance"]
    advised = ast.literal_eval(finding.suggestion.split("batch_shares=", 1)[1].split(")")[0])
    pasted = timer(model, batch, batch_shares=advised, **run)
    auto = timer(model, batch, batch_shares="auto", **run)
    return {"even": even.imbalance, "suggestion": finding.suggestion, "advised": advised,
            "pasted": pasted.imbalance, "pasted_rows": [r.batch_size for r in pasted.per_rank],
            "before": auto.imbalance_before, "auto_shares": auto.shares_used,
            "auto_rows": [r.batch_size for r in auto.per_rank], "after": auto.imbalance,
            "steps": (even.step_time_s, pasted.step_time_s, auto.step_time_s)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--ms", type=float, default=MS_PER_SAMPLE)
    args = parser.parse_args()

    from pytest_distperf.fixtures.group import DistGroup
    from pytest_distperf.fixtures.steptimer import DDPStepTimer
    from pytest_distperf.pool.launcher import RankPool

    pool = RankPool(2, "gloo", timeout_s=600)
    try:
        timer = DDPStepTimer(DistGroup(pool))
        rounds = [round_of(timer, args.rows, args.ms, args.steps) for _ in range(args.rounds)]
    finally:
        pool.close()

    print(f"\n{datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.machine()}, gloo, 2 ranks; "
          f"{args.rows} rows, {args.ms:g} ms per sample on rank 0, {2 * args.ms:g} on rank 1; "
          f"{args.steps} steps\n")
    print("| round | even: imbalance | advised shares | pasted: rows, imbalance | "
          "auto: before | auto: shares used (rows) | auto: after | step even / pasted / auto |")
    print("|---|---|---|---|---|---|---|---|")
    for k, r in enumerate(rounds, 1):
        used = ", ".join(f"{s:.3f}" for s in r["auto_shares"])
        steps = " / ".join(f"{s * 1e3:.1f} ms" for s in r["steps"])
        print(f"| {k} | {r['even']:.3f} | {r['advised']} | {r['pasted_rows']}, "
              f"{r['pasted']:.3f} | {r['before']:.3f} | {used} ({r['auto_rows']}) | "
              f"{r['after']:.3f} | {steps} |")
    print(f"\nsuggestion (round 1): {rounds[0]['suggestion']}")


if __name__ == "__main__":
    main()
