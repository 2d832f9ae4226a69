"""Order statistics of small samples, the one place they are computed.  Stdlib only.

Every figure in pytest-distperf that is a quantile or a median (a collective's time, a
phase's spread, a verdict's estimate) comes from here.  The quantile is numpy's default
(``method="linear"``), computed the same way to the last bit, so that figures stored by
earlier versions compare exactly; values that are None, NaN or infinite are left out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def finite(values: Iterable[float | None]) -> list[float]:
    """The values that are finite numbers, as floats, in their order."""
    out: list[float] = []
    for value in values:
        if value is None:
            continue
        number = float(value)
        if math.isfinite(number):
            out.append(number)
    return out


def quantile(values: Iterable[float | None], q: float) -> float | None:
    """The ``q`` quantile (0..1, linear interpolation) of the finite values; None when there
    are none."""
    ordered = sorted(finite(values))
    if not ordered:
        return None
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    t = position - low
    a, b = ordered[low], ordered[high]
    # numpy's lerp: from the nearer end, so that q = 1 gives the maximum exactly
    return b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t


def median(values: Iterable[float | None]) -> float | None:
    """The median of the finite values (the mean of the middle two for an even count); None
    when there are none."""
    ordered = sorted(finite(values))
    n = len(ordered)
    if n == 0:
        return None
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def quantile_or_nan(values: Iterable[float | None], q: float) -> float:
    """:func:`quantile`, with NaN for no values (where a float must stand)."""
    value = quantile(values, q)
    return math.nan if value is None else value


def median_or_nan(values: Iterable[float | None]) -> float:
    """:func:`median`, with NaN for no values (where a float must stand)."""
    value = median(values)
    return math.nan if value is None else value
