"""A STAND-IN for nanoGPT's ``model.py``, for the CPU smoke run of ``benchmarks/gpu_gate.py``.

Never used for the GPU figures: those take a GPT from a public repository (``--gpt``).  It
has the interface the gate needs of such a file, and nothing more: ``GPTConfig`` (a dataclass
with ``block_size``, ``vocab_size``, ``n_layer``, ``n_head``, ``n_embd``, ``dropout``,
``bias``), ``GPT(config)`` whose blocks sit in an ``nn.ModuleList``, and
``GPT.forward(idx, targets) -> (logits, loss)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


@dataclasses.dataclass
class GPTConfig:
    block_size: int = 64
    vocab_size: int = 512
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 64
    dropout: float = 0.0
    bias: bool = True


class Block(nn.Module):
    """Pre-norm: causal self-attention, then a 4x MLP, each added to the residual."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        width = config.n_embd
        self.heads = config.n_head
        self.norm1 = nn.LayerNorm(width, bias=config.bias)
        self.qkv = nn.Linear(width, 3 * width, bias=config.bias)
        self.out = nn.Linear(width, width, bias=config.bias)
        self.norm2 = nn.LayerNorm(width, bias=config.bias)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width, bias=config.bias), nn.GELU(),
                                 nn.Linear(4 * width, width, bias=config.bias))

    def forward(self, x: Any) -> Any:
        b, t, c = x.shape
        q, k, v = (part.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for part in self.qkv(self.norm1(x)).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tokens = nn.Embedding(config.vocab_size, config.n_embd)
        self.positions = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(self, idx: Any, targets: Any = None) -> tuple[Any, Any]:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tokens(idx) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
