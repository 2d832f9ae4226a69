"""``ddp_step_timer(wrapper="fsdp")``'s rank side: which submodules FSDP2 shards, and the
sharding itself (torch).

FSDP2 manages every parameter in one group: the group of the nearest sharded module above
the module that holds it.  A parameter held by two modules (a token embedding tied to the
output head, as GPT- and Hugging Face-style models have it) must land in one group, so the
default policy leaves a block whose parameters are shared outside it to its parent.  A
module ``model_fn`` sharded already is kept as it is, and a policy that splits tied
parameters is refused before ``fully_shard`` runs, naming the parameter and ``fsdp_policy=``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

#: What a sharding error adds: how to choose the blocks instead.
POLICY_HINT = ("choose the blocks with fsdp_policy= (module classes, or a callable module -> "
               "bool), or shard the model in model_fn (the timer keeps an FSDPModule as it is)")


def shard_targets(model: Any, policy: Any = None) -> list[Any]:
    """The submodules FSDP2 shards on their own before the root, innermost first.

    ``policy``: module classes (a class or a tuple of them), or a callable module -> bool;
    None: every block of every ``ModuleList``/``ModuleDict`` (the repeated layers of
    GPT- and HF-style models), or, in a model without such containers, every direct child
    that has parameters, less the blocks whose parameters are shared with a module outside
    them (a tied embedding: it stays with its parent).  Containers themselves (no
    ``forward`` of their own) are never sharded: ``fully_shard`` refuses them.  Modules
    sharded already (``model_fn`` applied ``fully_shard``), and modules inside them, are
    left out: they are sharded once.
    """
    import torch

    def runs(m: Any) -> bool:
        return (m is not model and any(True for _ in m.parameters())
                and not isinstance(m, (torch.nn.ModuleList, torch.nn.ModuleDict)))

    modules = list(model.modules())
    chosen: list[Any]
    if policy is None:
        blocks = [child for m in modules
                  if isinstance(m, (torch.nn.ModuleList, torch.nn.ModuleDict))
                  for child in m.children()]
        chosen = [m for m in blocks or list(model.children())
                  if not shared_outside(model, m)]
    elif isinstance(policy, type) or (isinstance(policy, tuple)
                                      and all(isinstance(c, type) for c in policy)):
        chosen = [m for m in modules if isinstance(m, policy)]
    elif callable(policy):
        chosen = [m for m in modules if policy(m)]
    else:
        raise TypeError(f"ddp_step_timer: fsdp_policy must be module classes or a callable "
                        f"module -> bool, got {policy!r}")
    done = {id(m) for s in already_sharded(model) for m in s.modules()}
    keep = {id(m) for m in chosen if runs(m) and id(m) not in done}
    return [m for m in reversed(modules) if id(m) in keep]  # children before parents


def already_sharded(model: Any) -> list[Any]:
    """The submodules of ``model`` (not the root) that ``fully_shard`` was applied to."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if m is not model and isinstance(m, FSDPModule)]


def shared_outside(model: Any, block: Any) -> str:
    """The name of a parameter of ``block`` that a module outside ``block`` holds too (a tied
    weight), or ""."""
    inside = {id(m) for m in block.modules()}
    mine = {id(p) for p in block.parameters()}
    for name, m in model.named_modules():
        if id(m) in inside:
            continue
        for pname, p in m.named_parameters(recurse=False):
            if id(p) in mine:
                return f"{name}.{pname}" if name else pname
    return ""


def split_tied(model: Any, groups: list[Any]) -> str:
    """Where sharding ``groups`` (then the root) would put one parameter in two FSDP groups:
    the parameter's two names, which FSDP2 refuses at the first forward; "" where none."""
    group_ids = {id(g) for g in groups}
    owner: dict[int, tuple[int, str]] = {}  # parameter -> (its group, the name seen first)

    def walk(m: Any, prefix: str, group: int) -> str:
        group = id(m) if id(m) in group_ids else group
        for pname, p in m.named_parameters(recurse=False):
            name = f"{prefix}{pname}"
            seen = owner.setdefault(id(p), (group, name))
            if seen[0] != group:
                return f"{seen[1]!r} and {name!r}"
        for cname, child in m.named_children():
            found = walk(child, f"{prefix}{cname}.", group)
            if found:
                return found
        return ""

    return walk(model, "", id(model))


def shard(model: Any, policy: Any, kwargs: dict[str, Any]) -> Any:
    """``model`` with ``fully_shard`` applied to the targets of ``policy`` and then to the root
    (a root ``model_fn`` sharded itself is returned as it is); an error of FSDP2's comes back
    with what to change."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if isinstance(model, FSDPModule):  # sharded in model_fn already: used as it is
        return model
    targets = shard_targets(model, policy)
    done = already_sharded(model)
    where, tied = "model_fn's own fully_shard", split_tied(model, done)
    if not tied:
        where = "fsdp_policy" if policy is not None else "the default policy"
        tied = split_tied(model, targets + done)
    if tied:
        raise ValueError(f"ddp_step_timer: {where} puts the tied parameters {tied} (one "
                         f"tensor) in two FSDP2 groups, which FSDP2 refuses; shard the "
                         f"modules that share it together, or leave them to the root: "
                         f"{POLICY_HINT}")
    with _hinted():
        for block in targets:
            fully_shard(block, **kwargs)
        return fully_shard(model, **kwargs)


@contextlib.contextmanager
def _hinted() -> Iterator[None]:
    """FSDP2's refusal, with how to choose the blocks otherwise."""
    try:
        yield
    except (ValueError, RuntimeError, AssertionError, TypeError) as exc:
        message = f"ddp_step_timer: fully_shard failed: {exc}; {POLICY_HINT}"
        try:
            hinted = type(exc)(message)
        except Exception:  # an exception type that takes other arguments
            hinted = RuntimeError(message)
        raise hinted from exc


def no_sync_of(sharded: Any) -> Callable[[], Any]:
    """A context-manager factory that turns FSDP2's gradient synchronisation off."""

    @contextlib.contextmanager
    def no_sync() -> Iterator[None]:
        sharded.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            sharded.set_requires_gradient_sync(True)

    return no_sync
