"""``ddp_step_timer(mesh=...)``'s rank side: the ``DeviceMesh``, the model's parallelisation
(the user's ``parallelize(model, mesh)``, or the built-in TP plan and FSDP2 on ``dp``), and
the collectives of a step counted by mesh dimension (torch).

The mesh's groups are those every rank of the pool made before the call
(:func:`pytest_distperf.rank.worker.make_groups`: torch names a group by what its rank made
before, so all ranks make the same groups in the same order); each is made once per rank
process however many tests use it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from pytest_distperf.common.layout import Layout, dimension_of
from pytest_distperf.common.names import canonical_collective
from pytest_distperf.records import DimComm

_MESHES: dict[tuple[Layout, str, int], Any] = {}
#: Namespaces of the dispatcher's collective ops: c10d's own (FSDP2, DDP, send/recv) and
#: the functional ones DTensor issues.
COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")


def device_mesh(layout: Layout, device_type: str) -> Any:
    """The ``DeviceMesh`` of ``layout`` over the measured group (row-major, as
    ``init_device_mesh`` lays it out), made once per rank process."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    world, rank = dist.get_world_size(), dist.get_rank()
    key = (layout, device_type, world)
    if key not in _MESHES:
        shape = [size for _, size in layout]
        ranks = torch.arange(world).reshape(shape)
        groups = [_group(_row_of(ranks, d, rank)) for d in range(len(layout))]
        _MESHES[key] = DeviceMesh.from_group(groups, device_type, mesh=ranks,
                                             mesh_dim_names=tuple(n for n, _ in layout))
    return _MESHES[key]


def _row_of(ranks: Any, dim: int, rank: int) -> tuple[int, ...]:
    """The ranks that share every coordinate with ``rank`` but the one on ``dim``."""
    rows = ranks.movedim(dim, -1).reshape(-1, ranks.shape[dim]).tolist()
    return tuple(next(row for row in rows if rank in row))


def _group(ranks: tuple[int, ...]) -> Any:
    """The process group of ``ranks``: the measured group itself when it is all of them."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from pytest_distperf.rank.worker import GROUPS

    if list(ranks) == list(range(dist.get_world_size())):
        return c10d._get_default_group()
    if ranks not in GROUPS:  # made here by some ranks alone, torch would hang the next one
        raise RuntimeError(f"the process group of ranks {ranks} was not made before this "
                           f"call: run it with groups=mesh_groups(layout) "
                           f"(DistGroup.call, or the engine's execute)")
    return GROUPS[ranks]


def parallelized(model: Any, mesh: Any, parallelize: Callable[[Any, Any], Any] | None,
                 tp_plan: Any, data_parallel: Callable[[Any, Any], Any]) -> Any:
    """``parallelize(model, mesh)`` (the user's code, as torchtitan's ``parallelize_*``);
    else the built-in conveniences: ``tp_plan`` on the ``tp`` dimension
    (``parallelize_module``), then ``data_parallel(model, mesh["dp"])`` (FSDP2 or DDP)
    where the mesh has a ``dp`` dimension."""
    if parallelize is not None:
        out = parallelize(model, mesh)
        return model if out is None else out
    if tp_plan is not None:
        from torch.distributed.tensor.parallel import parallelize_module

        model = parallelize_module(model, mesh["tp"], tp_plan)
    if "dp" in (mesh.mesh_dim_names or ()):
        model = data_parallel(model, mesh["dp"])
    return model


def builtin_data_parallel(wrapper: str, kwargs: dict[str, Any], policy: Any,
                          device: Any) -> Callable[[Any, Any], Any]:
    """The built-in wrapper on the ``dp`` dimension, as ``(model, dp_mesh) -> model``:
    FSDP2 (``fully_shard`` on the policy's blocks, then the root) or DDP over its group."""

    def data_parallel(model: Any, dp: Any) -> Any:
        if wrapper == "fsdp":
            from pytest_distperf.rank.fsdp import shard

            return shard(model, policy, {**kwargs, "mesh": dp})
        from torch.nn.parallel import DistributedDataParallel

        extra: dict[str, Any] = {"device_ids": [device.index]} if device.type == "cuda" else {}
        return DistributedDataParallel(model, process_group=dp.get_group(), **extra, **kwargs)

    return data_parallel


def gradient_sync_switch(model: Any) -> tuple[Callable[[], Any], bool]:
    """A context-manager factory that turns the data-parallel gradient synchronisation of
    a parallelised model off (every FSDP2 module's, or DDP's ``no_sync``), and whether it
    has any: a model without either synchronises nothing the switch could leave out."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        return model.no_sync, True
    sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]

    @contextlib.contextmanager
    def no_sync() -> Iterator[None]:
        for m in sharded:
            m.set_requires_gradient_sync(False, recurse=False)
        try:
            yield
        finally:
            for m in sharded:
                m.set_requires_gradient_sync(True, recurse=False)

    return no_sync, bool(sharded)


def _message_bytes(value: Any) -> int:
    """A buffer's bytes: a tensor's, or a list's of tensors together."""
    import torch

    if isinstance(value, torch.Tensor):
        return int(value.numel() * value.element_size())
    if isinstance(value, (list, tuple)):
        return sum(_message_bytes(v) for v in value)
    return 0


def _group_of(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The process group a collective op runs on (by its name for the functional ops), or
    None for an op without one (``wait_tensor``)."""
    import torch
    from torch._C import _distributed_c10d as c10d

    for i, arg in enumerate(func._schema.arguments):
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        if arg.name == "group_name" and isinstance(value, str):
            return c10d._resolve_process_group(value)  # type: ignore[arg-type]  # a GroupName
        if isinstance(value, torch.ScriptObject) and "ProcessGroup" in str(arg.type):
            return c10d.ProcessGroup.unbox(value)
    return None


class _Tally:
    """What a collective counter saw: calls, bytes and blocked seconds per (dimension, op
    name), and the collectives whose results are not waited for yet."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.dims: dict[str, str] = {}  # group name -> its dimension
        self.counts: dict[tuple[str, str], tuple[int, int]] = {}
        self.seconds: dict[tuple[str, str], float] = {}
        self.pending: dict[int, tuple[str, str]] = {}  # id of a result -> its collective

    def key(self, group: Any, op: str) -> tuple[str, str]:
        """(the dimension ``group`` runs along, ``op``)."""
        import torch.distributed as dist

        if group.group_name not in self.dims:
            ranks = tuple(dist.get_process_group_ranks(group))
            self.dims[group.group_name] = dimension_of(self.layout, ranks)
        return self.dims[group.group_name], canonical_collective(op)

    def count(self, key: tuple[str, str], nbytes: int) -> None:
        calls, total = self.counts.get(key, (0, 0))
        self.counts[key] = (calls + 1, total + nbytes)

    def add(self, key: tuple[str, str], seconds: float) -> None:
        self.seconds[key] = self.seconds.get(key, 0.0) + seconds

    def result(self) -> tuple[DimComm, ...]:
        return tuple(DimComm(dim, op, calls, nbytes, self.seconds.get((dim, op), 0.0))
                     for (dim, op), (calls, nbytes) in sorted(self.counts.items()))


def comm_counter(layout: Layout, *, label: bool = False, timed: bool = False) -> Any:
    """A dispatch mode that counts every collective op by (mesh dimension, op name): calls
    and message bytes (the largest buffer, nccl-tests' size).  A group's dimension comes
    from its ranks (:func:`~pytest_distperf.common.layout.dimension_of`), so groups the
    user's code made itself count too.  Op names are canonical (the dispatcher's
    ``_allgather_base_`` and ``all_gather_into_tensor`` are ``all_gather``).  ``label``: wrap each
    collective in a ``mesh.<dim>.<op>`` range, which a profile's trace shows.  ``timed``
    (CPU ranks): the seconds this rank is blocked in each, issuing it and in the
    ``wait_tensor`` of its result (DTensor's collectives; c10d's own are waited on outside
    the dispatcher, so only their issue counts).  ``result()``: the counts as records."""
    from torch.profiler import record_function
    from torch.utils._python_dispatch import TorchDispatchMode

    try:
        from torch.distributed.tensor import DTensor as dtensor
    except ImportError:  # torch < 2.5
        from torch.distributed._tensor import DTensor as dtensor  # type: ignore[attr-defined]

    class CommCounter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.tally = _Tally(layout)
            self.result = self.tally.result

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            if any(issubclass(t, dtensor) for t in types):  # let DTensor issue its
                return NotImplemented  # collectives: they come back here on local tensors
            kwargs, tally = kwargs or {}, self.tally
            ours = func.namespace in COLLECTIVE_NAMESPACES
            group = _group_of(func, args, kwargs) if ours else None
            start = time.perf_counter()
            if group is None:
                waits = ours and args and func._opname == "wait_tensor"
                waited = tally.pending.pop(id(args[0]), None) if waits else None
                out = func(*args, **kwargs)
                if waited is not None and timed:  # the wait_tensor of a collective's result
                    tally.add(waited, time.perf_counter() - start)
                return out
            key = tally.key(group, func._opname)
            with record_function(f"mesh.{key[0]}.{key[1]}") if label else _nothing():
                out = func(*args, **kwargs)
            if timed:
                tally.add(key, time.perf_counter() - start)
                tally.pending[id(out)] = key
            tally.count(key, max(_message_bytes(v) for v in (*args, out)))
            return out

    return CommCounter()


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


@contextlib.contextmanager
def eager() -> Iterator[None]:
    """Compiled code run eagerly, for a step under the counters: torch.compile does not trace
    under a dispatch mode (with ``fullgraph=True`` it fails); the flop counter's warning
    about its global module hooks is muted."""
    import warnings

    import torch

    stance = getattr(torch.compiler, "set_stance", None)  # torch >= 2.6
    with warnings.catch_warnings(), stance("force_eager") if stance else _nothing():
        warnings.filterwarnings("ignore", message=".*global hooks on modules")
        yield
