"""What the runner check runs on the ranks (torch): the bare loops the plugin is compared
with, the workloads both time, and the readings only a rank can take.

These are a user's code, sent with ``nccl_group.run`` as a test's own functions are; they
use nothing of the plugin's rank side, so that a fault in its timing shows as a ratio.
Each bare loop is timed as the plugin times (benchmarks/gpu.md: on one GPU a loop that
synchronizes the device before each call reads 2-6 us more per call than one that does not):
a barrier before each timed call, then ``time.perf_counter`` on CPU or CUDA events on a GPU
around the call alone, the end event waited for; a barrier after the last.
"""

from __future__ import annotations

import functools
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from pytest_distperf.doctor import nvml
from pytest_distperf.doctor.model import GpuReading
from pytest_distperf.doctor.plan import GptShape
from pytest_distperf.doctor.system import variables

_TENSORS: dict[tuple[Any, ...], Any] = {}  # the workloads' tensors, built once per rank


def _device() -> Any:
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _timed(fn: Callable[[], Any], device: Any) -> float:
    """Seconds of one call from a barrier: the host clock on CPU, CUDA events on a GPU."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    fn()
    end.record()
    end.synchronize()
    return float(begin.elapsed_time(end)) / 1e3


def timed_loop(fn: Callable[[], Any], warmup: int, iters: int) -> list[float]:
    """Seconds per call of ``fn`` on this rank, ``iters`` calls after ``warmup``."""
    import torch
    import torch.distributed as dist

    device = _device()
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the warm-up's queue, once, as the plugin does
    out = [_timed(fn, device) for _ in range(iters)]
    dist.barrier()
    return out


# -- the workloads -------------------------------------------------------------------------
def matmuls(reps: int) -> None:
    """``reps`` products of two square matrices: 256 float32 on CPU (the workload of
    benchmarks/verdict_quality.md), 4096 bf16 on a GPU."""
    import torch

    device = _device()
    key = ("mm", str(device))
    if key not in _TENSORS:
        n, dtype = (4096, torch.bfloat16) if device.type == "cuda" else (256, torch.float32)
        g = torch.Generator().manual_seed(0)
        a, b = (torch.randn(n, n, generator=g).to(device, dtype) for _ in range(2))
        _TENSORS[key] = (a, b, torch.empty(n, n, device=device, dtype=dtype))
    a, b, out = _TENSORS[key]
    for _ in range(reps):
        torch.mm(a, b, out=out)


def bare_measure(reps: int, warmup: int, iters: int) -> list[float]:
    """The bare loop beside ``measure("matmul", matmuls, reps)``."""
    return timed_loop(lambda: matmuls(reps), warmup, iters)


def bare_all_reduce(nbytes: int, warmup: int, iters: int) -> list[float]:
    """The bare loop beside ``bench("all_reduce", nbytes)``: float32 zeros, back to back."""
    import torch
    import torch.distributed as dist

    tensor = torch.zeros(nbytes // 4, dtype=torch.float32, device=_device())
    return timed_loop(lambda: dist.all_reduce(tensor), warmup, iters)


def tiny_gpt(shape: GptShape) -> Any:
    import torch

    class TinyGPT(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(shape.vocab, shape.dim)
            layer = torch.nn.TransformerEncoderLayer(shape.dim, shape.heads, 4 * shape.dim,
                                                     dropout=0.0, batch_first=True,
                                                     norm_first=True)
            self.blocks = torch.nn.TransformerEncoder(layer, shape.layers,
                                                      enable_nested_tensor=False)
            self.head = torch.nn.Linear(shape.dim, shape.vocab)

        def forward(self, tokens: Any) -> Any:
            return self.head(self.blocks(self.embed(tokens)))

    model = TinyGPT()
    return model.to(torch.bfloat16) if shape.bf16 else model


def gpt_batch(shape: GptShape, rank: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(rank)
    return torch.randint(0, shape.vocab, (shape.batch, shape.seq), generator=g)


def model_of(shape: GptShape) -> Callable[[], Any]:
    """``model_fn`` for the step timer: the model of ``shape``."""
    return functools.partial(tiny_gpt, shape)


def batch_of(shape: GptShape) -> Callable[[int], Any]:
    """``batch_fn`` for the step timer: a rank's tokens."""
    return functools.partial(gpt_batch, shape)


def gpt_loss(logits: Any) -> Any:
    return logits.float().logsumexp(-1).mean()


def bare_ddp(shape: GptShape, steps: int, warmup: int) -> list[float]:
    """The bare loop beside ``ddp_step_timer``: the same model, DDP, SGD and batch, steps
    back to back from one barrier, a timestamp between them (benchmarks/ddp_overhead.md)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    device = _device()
    torch.manual_seed(0)
    model = tiny_gpt(shape).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index]
                                  if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    batch = gpt_batch(shape, dist.get_rank()).to(device)

    def step() -> None:
        gpt_loss(ddp(batch)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    dist.barrier()

    def mark() -> Any:
        if not cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    marks = [mark()]
    for _ in range(steps):
        step()
        marks.append(mark())
    if not cuda:
        return [b - a for a, b in itertools.pairwise(marks)]
    torch.cuda.synchronize(device)
    return [float(a.elapsed_time(b)) / 1e3 for a, b in itertools.pairwise(marks)]


# -- readings ------------------------------------------------------------------------------
def rank_environment() -> dict[str, Any]:
    """What this rank sees: its variables, CPU model, device, cores and process id."""
    import torch

    device = _device()
    name, uuid = "cpu", ""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name = f"cuda:{device.index} {props.name}, {props.total_memory / 2**30:.0f} GiB, " \
               f"{props.multi_processor_count} SMs"
        uuid = _uuid(props)
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:
        cores = list(range(os.cpu_count() or 1))
    return {"variables": list(variables(os.environ)), "cpu_model": _cpu_model(),
            "device": name, "uuid": uuid, "cores": cores, "pid": os.getpid(),
            "hostname": socket.gethostname()}


def _uuid(props: Any) -> str:
    value = str(getattr(props, "uuid", "") or "")
    return value if not value or value.startswith("GPU-") else f"GPU-{value}"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name")), "")
    except OSError:
        return ""


def gpu_reading(own_pids: list[int], busy_s: float = 1.0) -> GpuReading | str:
    """NVML's reading of this rank's GPU after ``busy_s`` of matrix products, read while
    they still run (an idle GPU lowers its clocks by design); a sentence where there is
    none."""
    import torch

    device = _device()
    if device.type != "cuda":
        return "no GPU on this rank"
    stop = threading.Event()

    def busy() -> None:
        torch.cuda.set_device(device)  # a thread starts on device 0
        while not stop.is_set():
            matmuls(8)
            torch.cuda.synchronize(device)

    worker = threading.Thread(target=busy, daemon=True)
    worker.start()
    try:
        time.sleep(busy_s)  # the clocks ramp up under the load
        return nvml.read(device.index, _uuid(torch.cuda.get_device_properties(device)),
                         own_pids)
    finally:
        stop.set()
        worker.join()
