"""Per-rank shares of a global batch: checked, derived from throughput, turned into rows.

Standard library only: the controller checks a test's ``batch_shares=``, the analysis suggests
shares, and the ranks split their batch and derive shares of their own (``"auto"``) with the
same functions.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

#: The smallest share of the global batch any rank is given or may be given.
MIN_BATCH_SHARE = 0.05
#: ``batch_shares="auto"``: measure the ranks' throughput first, then split by it.
AUTO = "auto"
#: How far from 1 a test's shares may sum (rounding in a hand-written list).
_SUM_TOLERANCE = 1e-6


def min_share(world_size: int) -> float:
    """The minimum share on ``world_size`` ranks: ``MIN_BATCH_SHARE``, or an even split
    where that leaves no room (more than 20 ranks)."""
    return min(MIN_BATCH_SHARE, 1.0 / max(1, world_size))


def check_shares(value: object, world_size: int,
                 what: str = "ddp_step_timer: batch_shares") -> tuple[float, ...] | str:
    """``value`` as the shares of ``world_size`` ranks (normalised to sum exactly to 1), or
    ``"auto"``; a clear error naming the value otherwise."""
    if value == AUTO:
        return AUTO
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{what} must be a list of one share per rank (fractions of the "
                        f"global batch that sum to 1, e.g. [0.6, 0.4]) or 'auto', got "
                        f"{value!r}")
    if len(value) != world_size:
        raise ValueError(f"{what}={value!r} has {len(value)} shares for {world_size} ranks: "
                         f"give one per rank")
    bad = [s for s in value if isinstance(s, bool) or not isinstance(s, numbers.Real)
           or not math.isfinite(s)]
    if bad:
        raise TypeError(f"{what}={value!r}: {bad[0]!r} is not a finite number")
    low = min_share(world_size)
    for rank, share in enumerate(value):
        if share < 0:
            raise ValueError(f"{what}={value!r}: rank {rank}'s share {share!r} is negative")
        if share < low - _SUM_TOLERANCE:
            raise ValueError(f"{what}={value!r}: rank {rank}'s share {share!r} is below the "
                             f"minimum {low:g} (every rank trains on at least {low:.0%} of "
                             f"the batch)")
    total = math.fsum(value)
    if abs(total - 1.0) > _SUM_TOLERANCE:
        raise ValueError(f"{what}={value!r} sums to {total:g}, not 1: give each rank's "
                         f"fraction of the global batch")
    return tuple(float(s) / total for s in value)


def batch_shares(throughput: Sequence[float | None],
                 min_share: float = MIN_BATCH_SHARE) -> tuple[float, ...]:
    """Per-rank shares of the global batch proportional to measured throughput, each at least
    ``min_share``, summing to 1.

    Ranks without a usable throughput get the mean of the others'; with none usable, or when
    ``min_share`` leaves no room (n * min_share >= 1), the shares are equal.
    """
    n = len(throughput)
    if n == 0:
        return ()
    values = [float(t) if t is not None and math.isfinite(float(t)) and float(t) > 0 else None
              for t in throughput]
    known = [v for v in values if v is not None]
    if not known or n * min_share >= 1.0:
        return tuple([1.0 / n] * n)
    fill = sum(known) / len(known)
    weights = [v if v is not None else fill for v in values]
    fixed: set[int] = set()
    while True:  # raise the shares below the minimum to it, re-split the rest; ends: n * min < 1
        room = 1.0 - min_share * len(fixed)
        free = sum(w for i, w in enumerate(weights) if i not in fixed)
        shares = [min_share if i in fixed else w / free * room for i, w in enumerate(weights)]
        low = {i for i, s in enumerate(shares) if i not in fixed and s < min_share}
        if not low:
            return tuple(shares)
        fixed |= low


def split_sizes(rows: int, shares: Sequence[float]) -> tuple[int, ...]:
    """Rows of a batch of ``rows`` for each share: at least one each, summing to ``rows``
    (the largest remainders get the rows rounding left over)."""
    n = len(shares)
    if rows < n:
        raise ValueError(f"ddp_step_timer: batch_shares splits the global batch along dim 0 "
                         f"over {n} ranks, but it has {rows} rows: give it at least {n}")
    exact = [s * rows for s in shares]
    sizes = [max(1, math.floor(x)) for x in exact]
    by_remainder = sorted(range(n), key=lambda i: exact[i] - sizes[i], reverse=True)
    for k in range(rows - sum(sizes)):
        sizes[by_remainder[k % n]] += 1
    while sum(sizes) > rows:  # the ones raised to a row took it from the largest
        sizes[max(range(n), key=lambda i: sizes[i])] -= 1
    return tuple(sizes)


def pasteable(shares: Sequence[float]) -> str:
    """The shares as ``batch_shares=`` accepts them, in hundredths that sum to 1 and keep
    the minimum: ``[0.67, 0.33]``."""
    hundredths = split_sizes(100, shares) if len(shares) <= 100 else ()
    if not hundredths or min(hundredths) < 100 * min_share(len(shares)):
        return "[" + ", ".join(f"{s:.4g}" for s in shares) + "]"
    return "[" + ", ".join(f"{h / 100:g}" for h in hundredths) + "]"


def ema(values: Sequence[float], alpha: float) -> float | None:
    """The exponential moving average of ``values`` (the first value starts it)."""
    out: float | None = None
    for v in values:
        out = v if out is None else alpha * v + (1.0 - alpha) * out
    return out
