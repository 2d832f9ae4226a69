"""Does one set of rank processes run at its own speed?  Pools against rounds, interleaved.

Starts ``--pools`` rank pools of 2 gloo ranks at once (each with one CPU thread per rank, as
the plugin starts them), then, ``--rounds`` times, measures the same work on every pool in
turn: ``--steps`` training steps (forward, backward, optimizer) of a small GPT-style model
(token embedding, 2 pre-norm encoder layers, a vocabulary head; the model of
``benchmarks/ddp_verdicts.py``, without DDP), each step started at a barrier and timed on
every rank, a step's time the slower rank's.  One measurement's figure is the 25% quantile of
its steps (what the verdict judges a controlled time by) and the median.

A two-way analysis of variance of log(figure) over pools x rounds splits the variation into
a *pool* part (a pool that is faster or slower in every round: what re-measuring on the same
ranks cannot average out), a *round* part (the host's speed moving over time: what the
host-speed control is for) and the rest (a measurement's own sampling error).  The F statistic
says whether the pool part is more than the rest would give by chance (F about 1: no pool
effect; its 1% point for 8 pools and 6 rounds is about 3.2).

    python benchmarks/pool_offsets.py                      # 8 pools, 6 rounds, 20 steps
    python benchmarks/pool_offsets.py --pools 6 --rounds 8 --steps 10 --json runs.json

Results: benchmarks/pool_offsets.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

VOCAB, DIM, SEQ, BATCH = 512, 128, 32, 20


def train_steps(steps: int) -> list[float]:
    """On a rank: ``steps`` timed training steps of the model, after 2 untimed ones; the
    model is built on the rank's first call and kept for the pool's life."""
    import time

    import torch
    import torch.distributed as dist

    state = sys.modules[__name__].__dict__
    if "_model" not in state:
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(DIM, 4, 4 * DIM, dropout=0.0,
                                                 batch_first=True, norm_first=True)
        state["_model"] = torch.nn.Sequential(
            torch.nn.Embedding(VOCAB, DIM),
            torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
            torch.nn.Linear(DIM, VOCAB))
        state["_tokens"] = torch.randint(
            0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(dist.get_rank()))
    model, tokens = state["_model"], state["_tokens"]
    opt = torch.optim.SGD(model.parameters(), lr=0.0)

    def step() -> None:
        opt.zero_grad()
        model(tokens).logsumexp(-1).mean().backward()
        opt.step()

    for _ in range(2):
        step()
    times = []
    for _ in range(steps):
        dist.barrier()
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return times


def anova(table: np.ndarray) -> dict[str, float]:
    """Two-way ANOVA without replication of ``table[round, pool]`` (log figures): the pool
    and round parts as standard deviations (relative), the rest, and F for pools."""
    rounds, pools = table.shape
    grand = table.mean()
    pool = table.mean(0) - grand
    rnd = table.mean(1) - grand
    rest = table - grand - pool[None, :] - rnd[:, None]
    ms_pool = rounds * float((pool ** 2).sum()) / (pools - 1)
    ms_round = pools * float((rnd ** 2).sum()) / (rounds - 1)
    ms_rest = float((rest ** 2).sum()) / ((pools - 1) * (rounds - 1))
    return {"pool_sd": math.sqrt(max(0.0, (ms_pool - ms_rest) / rounds)),
            "round_sd": math.sqrt(max(0.0, (ms_round - ms_rest) / pools)),
            "rest_sd": math.sqrt(ms_rest), "f_pools": ms_pool / ms_rest if ms_rest else math.inf,
            "pool_effects": [float(x) for x in pool]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pools", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per measurement")
    parser.add_argument("--json", type=Path, help="write every measurement's step times here")
    args = parser.parse_args(argv)
    if args.pools < 2 or args.rounds < 2 or args.steps < 2:
        parser.error("--pools, --rounds and --steps must be at least 2")

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from pytest_distperf.pool.launcher import RankPool

    started = datetime.datetime.now(datetime.timezone.utc)
    pools = []
    try:
        for i in range(args.pools):
            print(f"starting pool {i + 1}/{args.pools} ...", flush=True)
            pool = RankPool(2, "gloo")
            pool.start()
            pools.append(pool)
        runs: list[dict[str, Any]] = []
        for r in range(args.rounds):
            for i, pool in enumerate(pools):
                per_rank = pool.execute(train_steps, (args.steps,), {}, 2, "train_steps")
                steps = [max(t) for t in zip(*per_rank, strict=True)]
                runs.append({"round": r, "pool": i, "steps_s": steps})
                print(f"round {r + 1}/{args.rounds} pool {i + 1}: median "
                      f"{statistics.median(steps) * 1e3:.2f} ms", flush=True)
    finally:
        for pool in pools:
            pool.close()

    print(f"\n{started:%Y-%m-%d %H:%M} UTC, {platform.machine()}, {len(pools)} pools of 2 "
          f"gloo ranks, {args.rounds} rounds, {args.steps} steps per measurement")
    print("figure  pool SD  round SD  rest SD  F(pools)  pool effects")
    for name, q in (("q25", 0.25), ("median", 0.5)):
        table = np.zeros((args.rounds, len(pools)))
        for run in runs:
            table[run["round"], run["pool"]] = math.log(float(np.quantile(run["steps_s"], q)))
        a = anova(table)
        effects = " ".join(f"{100 * e:+.1f}%" for e in a["pool_effects"])
        print(f"{name:6}  {100 * a['pool_sd']:6.2f}%  {100 * a['round_sd']:7.2f}%  "
              f"{100 * a['rest_sd']:6.2f}%  {a['f_pools']:8.2f}  {effects}")
    if args.json:
        args.json.write_text(json.dumps(runs))


if __name__ == "__main__":
    main()
