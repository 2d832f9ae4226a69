"""What a training step is fed, on the rank: its batch on the rank's device, the loss's
target, the default loss, and whether ``optimizer_fn`` wants the module (torch)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def default_loss(output: Any) -> Any:
    import torch

    if not isinstance(output, torch.Tensor):
        raise TypeError(f"ddp_step_timer: the model returned {type(output).__name__}, not a "
                        f"tensor; pass loss_fn= to turn it into a scalar loss")
    return output.sum()


def prepare_batch(batch: Any, device: Any, rank: int, world: int,
                   split: bool) -> tuple[Any, int]:
    """The batch on ``device`` (a tensor, or a tuple for ``model(*batch)``) and its size."""
    import torch

    items = tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
    if not items or not all(isinstance(t, torch.Tensor) for t in items):
        kinds = ", ".join(type(t).__name__ for t in items) or "nothing"
        raise TypeError(f"ddp_step_timer: batch_fn(rank) must return a tensor or a tuple of "
                        f"tensors, got {kinds}")
    if split:
        short = [tuple(t.shape) for t in items if t.dim() == 0 or t.shape[0] < world]
        if short:
            raise ValueError(f"ddp_step_timer.scaling(mode='strong'): the global batch is split "
                             f"over {world} ranks along dim 0, but batch_fn returned shapes "
                             f"{short} with fewer than {world} rows")
        items = tuple(t.tensor_split(world)[rank] for t in items)
    items = tuple(t.to(device) for t in items)
    size = int(items[0].shape[0]) if items[0].dim() > 0 else 1
    if isinstance(batch, (tuple, list)):
        return items, size
    return items[0], size


def takes_module(fn: Callable[..., Any]) -> bool:
    """Whether ``optimizer_fn`` wants the module (its first parameter is named ``model`` or
    ``module``, as in ``lambda model: model.configure_optimizers(...)``) rather than the
    parameters."""
    import inspect

    try:
        first = next(iter(inspect.signature(fn).parameters), "")
    except (TypeError, ValueError):
        return False
    return first in ("model", "module")


def target_of(target_fn: Callable[[int], Any], index: int, device: Any,
              who: str = "ddp_step_timer") -> Any:
    """``target_fn(index)`` on ``device``, checked to be a tensor (``who``: the fixture)."""
    import torch

    target = target_fn(index)
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"{who}: target_fn({index}) must return a tensor, got "
                        f"{type(target).__name__}")
    return target.to(device)
