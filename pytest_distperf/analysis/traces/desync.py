"""Did every rank run the same collectives in the same order?  A flight-recorder-style
check made before any figure of a profile is trusted.  Stdlib only."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from pytest_distperf.analysis.traces.rank_timeline import CommOp
from pytest_distperf.common.names import P2P, SAME_SIZE_EVERYWHERE
from pytest_distperf.fixtures.results.profile import ProfileReport


class DesyncError(Exception):
    """The ranks ran different collectives (or in a different order): no figure is trusted."""

    def __init__(self, message: str, report: ProfileReport | None = None) -> None:
        super().__init__(message)
        self.report = report


def check_desync(sequences: Mapping[int, Sequence[CommOp]]) -> str:
    """Empty when the ranks ran the same collectives in the same order; else what differs.

    Compared per process group (where the trace names it), collectives only (send/recv pair
    differently by design): the collective's name, and its size and dtype where the size is
    the same on every rank by definition (not all_to_all, gather, scatter).
    """
    profiled = sorted(sequences)
    by_group: dict[str, dict[int, list[CommOp]]] = defaultdict(lambda: defaultdict(list))
    members: dict[str, set[int]] = defaultdict(set)
    for rank in profiled:
        for op in sequences[rank]:
            if op.name in P2P:
                continue
            by_group[op.group][rank].append(op)
            members[op.group].add(rank)
            members[op.group].update(r for r in op.group_ranks if r in sequences)
    problems: list[str] = []
    for group in sorted(by_group):
        ranks = sorted(members[group])
        if group == "" or len(ranks) < 2:
            # unnamed group (the c10d path), or a group only one rank named: all profiled ranks
            sizes = {op.group_size for ops in by_group[group].values() for op in ops}
            if group == "" or sizes == {len(profiled)}:
                ranks = profiled
        if len(ranks) < 2:
            continue
        seqs = {r: by_group[group].get(r, []) for r in ranks}
        problem = _first_difference(seqs)
        if problem:
            where = f" in process group {group!r}" if group else ""
            problems.append(f"ranks ran different collectives{where}: {problem}")
    return "\n".join(problems)


def _same(a: CommOp, b: CommOp) -> bool:
    """Whether two ranks' calls are the same collective (size and dtype where comparable)."""
    if a.name != b.name:
        return False
    if a.name not in SAME_SIZE_EVERYWHERE or a.name == "barrier":
        return True
    # a size or dtype that one trace could not tell is not a difference
    same_size = not a.nelems or not b.nelems or a.nelems == b.nelems
    return same_size and (not a.dtype or not b.dtype or a.dtype == b.dtype)


def _first_difference(seqs: Mapping[int, Sequence[CommOp]]) -> str:
    ranks = sorted(seqs)
    longest = max(len(s) for s in seqs.values())
    for i in range(longest):
        ops = {r: (seqs[r][i] if i < len(seqs[r]) else None) for r in ranks}
        first = ops[ranks[0]]
        if all(op is not None and first is not None and _same(op, first)
               for op in ops.values()):
            continue
        said = "; ".join(f"rank {r}: {op.describe() if op else 'nothing (it had stopped)'}"
                         for r, op in ops.items())
        text = f"collective #{i + 1} differs ({said})"
        counts = {r: len(s) for r, s in seqs.items()}
        if len(set(counts.values())) > 1:
            text += "; collectives per rank: " + ", ".join(
                f"rank {r}: {n}" for r, n in counts.items())
        return text
    return ""
