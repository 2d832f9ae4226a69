"""Frozen dataclasses of plain values: what crosses a process boundary or is stored.

No torch, no pytest.  ``to_dict``/``from_dict`` give every record a JSON round-trip.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def to_dict(record: Any) -> Any:
    """A JSON-ready structure (dicts, lists, str, numbers, None) for a record tree.

    Fields marked ``metadata={"transient": True}`` (callables, live handles) are left out.
    """
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return {f.name: to_dict(getattr(record, f.name)) for f in dataclasses.fields(record)
                if not f.metadata.get("transient")}
    if isinstance(record, dict):
        return {str(k): to_dict(v) for k, v in record.items()}
    if isinstance(record, (list, tuple)):
        return [to_dict(v) for v in record]
    return record


def from_dict(cls: type[T], data: Any) -> T:
    """Rebuild a record of type ``cls`` from :func:`to_dict`'s output."""
    return typing.cast(T, _build(cls, data))


def _build(tp: Any, data: Any) -> Any:
    if data is None:
        return None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        non_none = [a for a in args if a is not type(None)]
        return _build(non_none[0], data) if len(non_none) == 1 else data
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        kwargs = {
            f.name: _build(hints[f.name], data[f.name])
            for f in dataclasses.fields(tp)
            if f.name in data
        }
        return tp(**kwargs)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], v) for v in data)
        return tuple(_build(a, v) for a, v in zip(args, data))
    if origin is list:
        return [_build(args[0], v) for v in data]
    if origin is dict:
        return {_build(args[0], k) if args[0] is not str else k: _build(args[1], v)
                for k, v in data.items()}
    if tp is float and isinstance(data, int):
        return float(data)
    return data


@dataclasses.dataclass(frozen=True, slots=True)
class Environment:
    """What a baseline is keyed by: results are only compared within one environment."""

    backend: str
    device_type: str  # "cuda" or "cpu"
    device_model: str  # e.g. "NVIDIA H100 80GB HBM3", or the CPU model name
    device_count: int  # devices used by the group (ranks on GPU; 0 on CPU)
    world_size: int
    torch_version: str
    nccl_version: str  # "" where NCCL is not in use

    def key(self) -> str:
        """A stable, readable key, e.g. ``gloo-cpu-w2-torch2.13.0`` (device model separate)."""
        parts = [self.backend, self.device_type, f"w{self.world_size}",
                 f"torch{self.torch_version.split('+')[0]}"]
        if self.nccl_version:
            parts.append(f"nccl{self.nccl_version}")
        return "-".join(parts)


@dataclasses.dataclass(frozen=True, slots=True)
class Metric:
    """One measured figure of a test, with what the verdict machinery needs to judge it.

    ``name`` is stable across runs (``all_reduce.16MiB.busbw_gbps``, ``step_time_s``);
    ``samples`` are the per-iteration values behind ``value`` (the estimator's input);
    ``threshold`` names the CONTRACT.md threshold that applies (``max_comm_overhead``,
    ``max_imbalance``, ``min_scaling_efficiency``) or is empty; ``ranks`` are the ranks a
    breach concerns (stragglers); ``hint`` is what to do about a breach.
    """

    name: str
    value: float
    unit: str = ""
    higher_is_better: bool = False
    samples: tuple[float, ...] = ()
    threshold: str = ""
    ranks: tuple[int, ...] = ()
    hint: str = ""
    world_size: int = 0  # the group the metric was measured on (0: the test's group)

    @property
    def is_fraction(self) -> bool:
        """Fractions near zero are judged in absolute points as well as relatively."""
        return self.unit == "fraction"


@dataclasses.dataclass(slots=True)
class TestRecord:
    """What one test measured and how it was judged (filled in while the test runs)."""

    __test__ = False  # not a pytest test class

    nodeid: str
    world_size: int
    metrics: list[Metric] = dataclasses.field(default_factory=list)
    results: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    breaches: list[str] = dataclasses.field(default_factory=list)
    #: label -> callable repeating that measurement (not stored, not sent between processes)
    remeasure: dict[str, Any] = dataclasses.field(
        default_factory=dict, repr=False, compare=False, metadata={"transient": True})


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return float("nan")
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


@dataclasses.dataclass(frozen=True, slots=True)
class MeasureResult:
    """What :meth:`DistGroup.measure` measured: per-rank samples and the per-iteration max."""

    name: str
    per_rank: tuple[tuple[float, ...], ...]  # seconds, [rank][iteration]
    samples: tuple[float, ...]  # seconds per iteration, slowest rank

    @classmethod
    def from_per_rank(cls, name: str, per_rank: Sequence[Sequence[float]]) -> MeasureResult:
        rows = tuple(tuple(float(v) for v in r) for r in per_rank)
        samples = tuple(max(col) for col in zip(*rows)) if rows else ()
        return cls(name, rows, samples)

    @property
    def time_s(self) -> float:
        """Median over iterations of the slowest rank's time."""
        return _median(self.samples)

    def metrics(self) -> list[Metric]:
        return [Metric(f"{self.name}.time_s", self.time_s, "s", False, self.samples)]
