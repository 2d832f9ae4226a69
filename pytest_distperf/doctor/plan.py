"""How much the runner check measures: the full check, or the quick one CI runs
(``DISTPERF_DOCTOR_QUICK=1``), on CPU ranks or GPUs.  No torch, no pytest.

The full check repeats each kind of metric as a save does (twelve measurements, half a
second apart: ``--distperf-save-measurements``' default and ``SAVE_PAUSE_S``), on the
workloads whose floors the benchmarks measured, so that its figures can be set beside
theirs: a 4 MiB all-reduce with a second of calls per measurement and 256x256 matrix
products 60 times per iteration (benchmarks/verdict_quality.md), the small GPT of
benchmarks/ddp_verdicts.md; and ``bench`` at 16 MiB against a bare
loop in many short rounds (benchmarks/fidelity.md).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from pytest_distperf.config import DEFAULT_SAVE_MEASUREMENTS

QUICK_VARIABLE = "DISTPERF_DOCTOR_QUICK"


@dataclasses.dataclass(frozen=True, slots=True)
class GptShape:
    """A small GPT-style model (token embedding, pre-norm encoder layers, a head)."""

    vocab: int = 512
    dim: int = 128
    layers: int = 2
    heads: int = 4
    batch: int = 20
    seq: int = 32
    bf16: bool = False


#: benchmarks/ddp_verdicts.md's model (a 33 ms step on 2 gloo ranks on a 2-core VM).
CPU_GPT = GptShape()
#: On a GPU the CPU model's step would be the host's launches (benchmarks/gpu.md): wider.
GPU_GPT = GptShape(vocab=8192, dim=1024, layers=4, heads=16, batch=16, seq=256, bf16=True)


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    quick: bool
    # fidelity: rounds that alternate the plugin, the bare loop and the bare loop again
    bench_size: str = "16MiB"
    bench_rounds: int = 20
    bench_iters: int = 3
    measure_rounds: int = 6
    measure_iters: int = 5
    step_rounds: int = 5
    step_steps: int = 8
    # noise floors: measurements as a save takes them
    measurements: int = DEFAULT_SAVE_MEASUREMENTS
    pause_s: float = 0.5
    floor_size: str = "4MiB"
    floor_seconds: float = 1.0  # bench's calls per measurement, as bench's default
    floor_iters: int = 20  # measure()'s default
    floor_steps: int = 10
    warmup: int = 2
    #: matrix products per measured call: verdict_quality.md's 60 of 256x256 float32 on CPU
    #: (22-28 ms on a 2-core VM), 8 of 4096x4096 bf16 on a GPU (about 1 ms)
    reps: int = 60
    gpt: GptShape = CPU_GPT


def plan_for(device_type: str, environ: Mapping[str, str] | None = None) -> Plan:
    """The full plan, or the quick one where ``DISTPERF_DOCTOR_QUICK`` is set (not 0), for
    ranks on ``device_type`` ("cpu" or "cuda")."""
    environ = os.environ if environ is None else environ
    quick = environ.get(QUICK_VARIABLE, "").strip() not in ("", "0")
    gpu = device_type == "cuda"
    plan = Plan(quick=False, reps=8 if gpu else 60, gpt=GPU_GPT if gpu else CPU_GPT)
    if gpu:  # GPU clocks settle over more steps (an A/A of 1.12 at 2 + 8); a step costs ms
        plan = dataclasses.replace(plan, warmup=5, step_rounds=4, step_steps=20,
                                   floor_steps=20)
    if not quick:
        return plan
    # three measurements are the fewest a floor is computed from; a fifth of a second of
    # calls; a GPT of one layer
    return dataclasses.replace(
        plan, quick=True, bench_size="1MiB", bench_rounds=4, bench_iters=2, measure_rounds=2,
        measure_iters=3, step_rounds=1, step_steps=3, measurements=3, pause_s=0.0,
        floor_size="1MiB", floor_seconds=0.2, floor_iters=5, floor_steps=3, warmup=1,
        reps=2 if gpu else 20, gpt=dataclasses.replace(plan.gpt, layers=1))
