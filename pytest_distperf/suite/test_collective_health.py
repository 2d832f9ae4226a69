"""The collective health check: ``pytest --pyargs pytest_distperf.suite --distperf``.

Each op is one test (a wrong result fails it, naming the size and rank); with
``--distperf-save`` the bus bandwidths become baselines, and later runs fail on a regression.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from pytest_distperf.analysis.topology import slow_pairs, suspect_ranks
from pytest_distperf.config import parse_size
from pytest_distperf.fixtures.collectives import OPS

#: On CPU (gloo) the sweep stops at 16 MiB, with fewer iterations, so that the suite stays
#: under a minute at 4 ranks on a 2-core machine; on GPU it is bench()'s default sweep,
#: 64 KiB .. 1 GiB, with bench()'s default 5 warm-up and 20 timed iterations.
CPU_SIZES = ("64KiB", "256KiB", "1MiB", "4MiB", "16MiB")
CPU_WARMUP, CPU_ITERS = 3, 10
GPU_WARMUP, GPU_ITERS = 5, 20


def _env(name: str, default: str) -> str:
    return os.environ.get(f"DISTPERF_SUITE_{name}", "").strip() or default


def _env_int(name: str, default: int) -> int:
    text = _env(name, str(default))
    try:
        return int(text)
    except ValueError:
        raise pytest.UsageError(
            f"DISTPERF_SUITE_{name}: expected a whole number, got {text!r}") from None


def _sizes(device_type: str) -> Any:
    text = _env("SIZES", "")
    if not text:
        return CPU_SIZES if device_type == "cpu" else None
    try:
        return [parse_size(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise pytest.UsageError(f"DISTPERF_SUITE_SIZES: {exc}") from None


@pytest.mark.parametrize("op", OPS)
def test_collective(nccl_group: Any, op: str) -> None:
    if op == "send_recv" and nccl_group.world_size < 2:
        pytest.skip("send_recv needs at least 2 ranks")
    cpu = nccl_group.device_type == "cpu"
    result = nccl_group.bench(op, _sizes(nccl_group.device_type),
                              dtype=_env("DTYPE", "float32"),
                              warmup=_env_int("WARMUP", CPU_WARMUP if cpu else GPU_WARMUP),
                              iters=_env_int("ITERS", CPU_ITERS if cpu else GPU_ITERS))
    assert result.wrong == 0  # bench raises first, with the details


def test_pairwise_send_recv(nccl_group: Any) -> None:
    """Every ordered pair of ranks, one at a time: a slow link or device stands out."""
    if nccl_group.world_size < 2:
        pytest.skip("the pair matrix needs at least 2 ranks")
    size = _env("PAIR_SIZE", "")
    cpu = nccl_group.device_type == "cpu"
    matrix = nccl_group.bench_pairs(size or None, dtype=_env("DTYPE", "float32"),
                                    iters=_env_int("ITERS", CPU_ITERS if cpu else GPU_ITERS))
    text = _env("MIN_PAIR_RATIO", "")
    if text:
        try:
            ratio = float(text)
        except ValueError:
            raise pytest.UsageError(
                f"DISTPERF_SUITE_MIN_PAIR_RATIO: expected a fraction such as 0.5, got {text!r}"
            ) from None
        slow = slow_pairs(matrix, ratio)
        suspects = suspect_ranks(matrix, ratio)
        assert not slow, (
            f"{len(slow)} pair(s) below {ratio:.0%} of a typical pair "
            f"({matrix.typical_gbps:.3f} GB/s): "
            + ", ".join(f"{p.src}->{p.dst} {p.busbw_gbps:.3f} GB/s" for p in slow)
            + (f"; suspect rank(s) {', '.join(map(str, suspects))}: check that device and "
               f"its link" if suspects else ""))
