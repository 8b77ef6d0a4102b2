"""A small decoder-only transformer (GPT-2 style, pre-LayerNorm) for the training lab.

Every matmul is either an ``nn.Linear`` or a :class:`lowbit.torch.MatMul`, so
:func:`lowbit.torch.emulate` can round all of them; LayerNorm, softmax, GELU, the
embeddings and the residual stream stay in float32 (as autocast keeps them).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn

from lowbit.errors import LowbitError
from lowbit.torch import MatMul


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape of the :class:`TinyDecoder`.

    Args:
        vocab: vocabulary size (256 for bytes).
        d_model: width of the residual stream.
        n_layers: transformer blocks.
        n_heads: attention heads (``d_model`` must divide by it).
        ctx: context length in tokens.
        ff_mult: feed-forward width as a multiple of ``d_model``.
    """

    vocab: int = 256
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    ctx: int = 64
    ff_mult: int = 4

    def __post_init__(self) -> None:
        for name in ("vocab", "d_model", "n_layers", "n_heads", "ctx", "ff_mult"):
            if getattr(self, name) < 1:
                raise LowbitError(f"{name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise LowbitError(
                f"d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})"
            )

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class Attention(nn.Module):
    """Causal multi-head self-attention; its two matmuls are :class:`MatMul` modules."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.scores = MatMul()
        self.mix = MatMul()
        mask = torch.triu(torch.ones(cfg.ctx, cfg.ctx, dtype=torch.bool), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.n_heads
        q, k, v = self.qkv(x).split(d, dim=-1)
        q = q.view(b, t, h, d // h).transpose(1, 2) * (1.0 / math.sqrt(d // h))
        k = k.view(b, t, h, d // h).transpose(1, 2)
        v = v.view(b, t, h, d // h).transpose(1, 2)
        att = self.scores(q, k.transpose(-1, -2))
        att = att.masked_fill(self.mask[:t, :t], float("-inf")).softmax(dim=-1)
        y = self.mix(att, v).transpose(1, 2).reshape(b, t, d)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.ff_mult * cfg.d_model)
        self.fc2 = nn.Linear(cfg.ff_mult * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


class TinyDecoder(nn.Module):
    """Token + position embeddings, ``n_layers`` pre-LN blocks, final LayerNorm, linear head.

    Weights are initialised as GPT-2 does (normal, std 0.02; the residual projections
    scaled by ``1/sqrt(2 n_layers)``) from the torch generator state at construction.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.ctx, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02
                if name.endswith(("proj.weight", "fc2.weight")):
                    std /= math.sqrt(2 * cfg.n_layers)
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, time, vocab]`` for token ids ``[batch, time]``."""
        t = idx.shape[1]
        if t > self.cfg.ctx:
            raise LowbitError(f"sequence of {t} tokens is longer than the context ({self.cfg.ctx})")
        pos = torch.arange(t, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.lm_head(self.ln_f(x))

    def block_linears(self) -> dict[str, nn.Module]:
        """The linears inside the transformer blocks (what QAT and PTQ quantize)."""
        return {
            n: m
            for n, m in self.named_modules()
            if n.startswith("blocks.") and hasattr(m, "weight") and m.weight.dim() == 2
        }
