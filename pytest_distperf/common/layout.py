"""Mesh layouts: where a rank sits on a ``DeviceMesh`` of named dimensions, which batch it
trains on, and which rank counts for a group.  Standard library only: the ranks and the
pure analysis use the same arithmetic."""

from __future__ import annotations

import math

#: A mesh layout: (dimension name, size) pairs, outermost first, as ``init_device_mesh`` takes
#: them; ranks are laid out row-major over it.
Layout = tuple[tuple[str, int], ...]
#: Dimensions that split the model, not the batch: the ranks along them share one batch.
MODEL_DIMS = frozenset({"tp", "pp", "cp"})
#: The dimension of a collective on a process group that is none of the mesh's.
OTHER_DIM = "other"


def coordinates(layout: Layout, rank: int) -> dict[str, int]:
    """``rank``'s coordinate on every dimension of ``layout`` (row-major)."""
    out: dict[str, int] = {}
    for name, size in reversed(layout):
        rank, out[name] = divmod(rank, size)
    return {name: out[name] for name, _ in layout}


def data_index(layout: Layout, rank: int) -> int:
    """Which batch ``rank`` trains on: its index over the data-parallel dimensions (those
    not in :data:`MODEL_DIMS`), row-major; 0 for every rank without one."""
    where = coordinates(layout, rank)
    index = 0
    for name, size in layout:
        if name not in MODEL_DIMS:
            index = index * size + where[name]
    return index


def mesh_groups(layout: Layout) -> tuple[tuple[int, ...], ...]:
    """The process groups a mesh of ``layout`` over ranks 0..n-1 is made of: per dimension,
    each row of ranks that differ only there; all of 0..n-1 left out (the measured group)."""
    total = math.prod(size for _, size in layout)
    rows: dict[tuple[int, ...], None] = {}
    for name, _ in layout:
        along: dict[tuple[int, ...], list[int]] = {}
        for rank in range(total):
            where = coordinates(layout, rank)
            along.setdefault(tuple(v for n, v in where.items() if n != name), []).append(rank)
        rows.update((tuple(r), None) for r in along.values() if len(r) < total)
    return tuple(rows)


def data_parallel(layout: Layout) -> tuple[str, ...]:
    """The layout's data-parallel dimensions: every one but ``tp``, ``pp`` and ``cp``."""
    return tuple(name for name, _ in layout if name not in MODEL_DIMS)


def counted_once(layout: Layout, rank: int) -> bool:
    """Whether ``rank`` stands for its TP, PP and CP groups (its coordinate is 0 on each):
    a batch shared along them is counted on that rank alone."""
    where = coordinates(layout, rank)
    return all(where[name] == 0 for name, _ in layout if name in MODEL_DIMS)


def dimension_of(layout: Layout, ranks: tuple[int, ...]) -> str:
    """The dimension a process group of ``ranks`` runs along: the one whose group these
    ranks are (they vary over all of it and agree on every other coordinate).  A group over
    several whole dimensions (a flattened mesh, or all of it) is ``dp`` where they are all
    data-parallel and no dimension is called so (torchtitan's flattened ``dp``), else their
    names joined (``dp_shard_cp``, ``dp_tp``); any other group is ``other``."""
    members = sorted(set(ranks))
    if not members or members[-1] >= math.prod(size for _, size in layout):
        return OTHER_DIM
    where = [coordinates(layout, r) for r in members]
    spans = [(name, size) for name, size in layout if len({c[name] for c in where}) > 1]
    if not spans:  # one rank: the group of a dimension of size 1
        return next((name for name, size in layout if size == 1), OTHER_DIM)
    if len(members) != math.prod(size for _, size in spans) or any(
            len({c[name] for c in where}) != size for name, size in spans):
        return OTHER_DIM
    names = [name for name, _ in spans]
    if len(names) > 1 and not set(names) & MODEL_DIMS and "dp" not in dict(layout):
        return "dp"
    return "_".join(names)
