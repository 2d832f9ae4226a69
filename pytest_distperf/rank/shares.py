"""``batch_shares=``'s rank side: this rank's rows of the global batch, the weight of its
loss, and the calibration that measures every rank's throughput (``"auto"``) (torch).

The weight: DDP and FSDP2 average the ranks' gradients, (1/W) sum_r grad L_r.  A loss that
averages over its rank's n_r rows (``loss_fn``, as PyTorch's ``reduction="mean"``) is
multiplied by W n_r / N, so that the average is the mean over the N rows of the global batch,
as with an even split; the default loss, ``output.sum()``, sums over its rows and needs none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from pytest_distperf.common.shares import batch_shares, ema, min_share, split_sizes
from pytest_distperf.rank.phase import set_phase

#: ``"auto"``: no-sync steps timed, every rank on an even split, before the shares are set.
CALIBRATION_STEPS = 6
#: The weight of the newest step in the throughput's exponential moving average.
EMA_ALPHA = 0.5


@dataclasses.dataclass
class Feed:
    """What this rank trains on: its batch (a tensor, or a tuple for ``model(*batch)``), its
    rows, and the weight of its loss; under batch shares, the global batch it is cut from."""

    batch: Any
    size: int
    weight: float = 1.0
    whole: tuple[Any, ...] = ()  # the global batch's tensors, under batch shares
    as_tuple: bool = False  # batch_fn returned a tuple: model(*batch)
    mean_loss: bool = False  # the loss averages over its rows (loss_fn), so it is weighted

    @classmethod
    def shared(cls, batch: Any, shares: Sequence[float], rank: int, *,
               mean_loss: bool) -> Feed:
        """This rank's share of ``batch``, the global batch (on the rank's device)."""
        as_tuple = isinstance(batch, tuple)
        feed = cls(batch, 0, whole=batch if as_tuple else (batch,), as_tuple=as_tuple,
                   mean_loss=mean_loss)
        feed.reshare(shares, rank)
        return feed

    def reshare(self, shares: Sequence[float], rank: int) -> None:
        """Cut this rank's rows again, by ``shares``, and weigh its loss by them."""
        first = self.whole[0]
        rows = int(first.shape[0]) if first.dim() > 0 else 0
        if any(t.dim() == 0 or t.shape[0] != rows for t in self.whole):
            raise ValueError(f"ddp_step_timer: batch_shares splits every tensor of the global "
                             f"batch along dim 0, but their first dimensions differ: "
                             f"{[tuple(t.shape) for t in self.whole]}")
        sizes = split_sizes(rows, shares)
        mine = tuple(t.split(sizes)[rank] for t in self.whole)
        self.batch = mine if self.as_tuple else mine[0]
        self.size = sizes[rank]
        self.weight = len(sizes) * sizes[rank] / rows if self.mean_loss else 1.0


def calibrate(time_compute: Callable[[int], float], rows: int, device: Any,
              steps: int = CALIBRATION_STEPS) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Time ``steps`` no-sync steps (``time_compute(k)``: step k's seconds, from a barrier)
    of this rank's ``rows``; every rank's throughput as an exponential moving average, and
    the shares proportional to it (the same on every rank).  (shares, this rank's times)."""
    import torch
    import torch.distributed as dist

    times = []
    for k in range(steps):
        set_phase(f"ddp_step_timer: batch_shares='auto', calibration step {k + 1}/{steps}")
        times.append(time_compute(k))
    rate = ema([rows / t for t in times if t > 0], EMA_ALPHA) or 0.0
    mine = torch.tensor([rate], dtype=torch.float64, device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    throughput = [float(t.item()) for t in every]
    return batch_shares(throughput, min_share(len(throughput))), tuple(times)
