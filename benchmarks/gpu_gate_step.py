"""The training step that ``benchmarks/gpu_gate.py`` gates, and the changes it makes to it.

``gpu_gate.py`` copies this file into its throw-away project as ``gate_step.py``, beside the
model file as ``gate_gpt.py`` (nanoGPT's ``model.py`` on a GPU, ``gpu_gate_standin.py`` on
CPU); the project's test and the script's hand-written loop both build their step from
:func:`make_step`, so that the two time the same thing.

The step: the GPT under bf16 autocast (forward and loss, as nanoGPT's ``train.py`` runs it;
the backward outside it), the loss the model returns, AdamW (fused where the parameters are
on a GPU).  The changes (``change``):

* ``larger``: ``extra_layers`` more blocks (the script picks the number that makes the model
  about 10% larger);
* ``collective``: one more all-reduce per step (of one float, in the loss);
* ``item``: ``loss.item()`` per step (a host-device synchronisation on a GPU);
* ``kept``: every block's output kept until the next step's forward has run (a bounded list
  of detached tensors): more peak memory, the same FLOPs.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from typing import Any

import gate_gpt  # the model file, copied in by gpu_gate.py
import torch
import torch.distributed as dist
from torch import nn

CHANGES = ("larger", "collective", "item", "kept")


class Step(nn.Module):
    """The GPT under bf16 autocast, returning the loss; with ``keep``, every block's output is
    kept until the next step's has replaced it."""

    def __init__(self, gpt: nn.Module, keep: bool) -> None:
        super().__init__()
        self.gpt = gpt
        blocks = [b for m in gpt.modules() if isinstance(m, nn.ModuleList) for b in m]
        # two steps' outputs: the last step's are still held at this step's peak
        self.kept: collections.deque[Any] = collections.deque(maxlen=2 * len(blocks))
        if keep:
            for block in blocks:
                block.register_forward_hook(self._keep)

    def _keep(self, module: nn.Module, args: Any, output: Any) -> None:
        self.kept.append(output.detach())

    def forward(self, idx: Any, targets: Any) -> Any:
        with torch.autocast(idx.device.type, dtype=torch.bfloat16):
            _, loss = self.gpt(idx, targets)
        return loss


def gpt_config(shape: dict[str, Any], extra_layers: int = 0) -> Any:
    """``gate_gpt.GPTConfig`` of ``shape`` (the fields it has), no dropout."""
    fields = {f.name for f in dataclasses.fields(gate_gpt.GPTConfig)}
    wanted = {"block_size": shape["seq"], "vocab_size": shape["vocab_size"],
              "n_layer": shape["n_layer"] + extra_layers, "n_head": shape["n_head"],
              "n_embd": shape["n_embd"], "dropout": 0.0}
    return gate_gpt.GPTConfig(**{k: v for k, v in wanted.items() if k in fields})


def parameters(shape: dict[str, Any], extra_layers: int = 0) -> int:
    """The model's parameters (tied ones once), counted on the meta device."""
    with torch.device("meta"), contextlib.redirect_stdout(None):  # nanoGPT prints its size
        gpt = gate_gpt.GPT(gpt_config(shape, extra_layers))
    return sum(p.numel() for p in gpt.parameters())


def make_step(shape: dict[str, Any], change: str = "") -> dict[str, Any]:
    """``ddp_step_timer``'s keywords for the step of ``shape`` (``n_layer``, ``n_head``,
    ``n_embd``, ``vocab_size``, ``seq``, ``batch``, ``extra_layers``) with ``change``:
    ``model_fn``, ``batch_fn``, ``loss_fn``, ``optimizer_fn``."""
    if change and change not in CHANGES:
        raise ValueError(f"gate_step: change must be one of {', '.join(CHANGES)} or empty, "
                         f"got {change!r}")
    config = gpt_config(shape, shape["extra_layers"] if change == "larger" else 0)
    batch, seq, vocab = shape["batch"], shape["seq"], shape["vocab_size"]

    def model_fn() -> nn.Module:
        # built on the rank's GPU where there is one: a CPU init of 124M parameters is slow
        on_gpu = dist.is_initialized() and dist.get_backend() == "nccl"
        where = (torch.device("cuda", torch.cuda.current_device()) if on_gpu
                 else contextlib.nullcontext())
        with where, contextlib.redirect_stdout(None):
            return Step(gate_gpt.GPT(config), keep=change == "kept")

    def batch_fn(rank: int) -> tuple[Any, Any]:
        g = torch.Generator().manual_seed(rank)
        tokens = torch.randint(0, vocab, (batch, seq + 1), generator=g)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def loss_fn(loss: Any) -> Any:
        if change == "collective":
            dist.all_reduce(torch.zeros(1, device=loss.device))
        if change == "item":
            loss.detach().item()
        return loss

    def optimizer_fn(params: list[Any]) -> Any:
        return torch.optim.AdamW(params, lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                                 fused=params[0].is_cuda)

    return {"model_fn": model_fn, "batch_fn": batch_fn, "loss_fn": loss_fn,
            "optimizer_fn": optimizer_fn}
