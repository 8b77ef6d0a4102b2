"""AdamW over FP32 master weights, with optional rounding of the weights to a storage format."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from lowbit.formats.base import Format
from lowbit.torch import round_to


class AdamW:
    """Adam with decoupled weight decay (Loshchilov & Hutter, arXiv 1711.05101).

    Moments are FP32. With ``storage`` set, each new weight ``w - lr*update`` is rounded to
    that format (to nearest, or stochastically with ``rounding="stochastic"``): the pure
    low-precision-weights recipe, where an update smaller than half a unit in the last
    place of the weight is lost unless rounding is stochastic. :attr:`lost` counts the
    updates that did not change their weight (nonzero update, same stored value).

    Args:
        params: the parameters (FP32).
        betas, eps, weight_decay: Adam's hyperparameters (decay on matrices only).
        storage: format the weights are stored in, or None (FP32 master weights).
        rounding: rounding of the stored weights.
        seed: seed of the stochastic rounding.
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        *,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        storage: str | Format | None = None,
        rounding: str = "nearest_even",
        seed: int = 0,
    ) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.betas = betas
        self.eps = eps
        self.weight_decay = weight_decay
        self.storage = storage
        self.rounding = rounding
        self.gen = torch.Generator().manual_seed(seed)
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.t = 0
        self.lost = 0
        self.updates = 0
        if storage is not None:
            with torch.no_grad():
                for p in self.params:
                    p.copy_(round_to(p, storage))

    @torch.no_grad()
    def step(self, lr: float) -> None:
        """One update of every parameter that has a gradient."""
        self.t += 1
        b1, b2 = self.betas
        c1 = 1 - b1**self.t
        c2 = 1 - b2**self.t
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
            if p.grad is None:
                continue
            g = p.grad
            m.lerp_(g, 1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            upd = (m / c1) / ((v / c2).sqrt() + self.eps)
            if self.weight_decay and p.dim() >= 2:
                upd = upd + self.weight_decay * p
            new = p - lr * upd
            if self.storage is not None:
                kw = {"seed": self.gen} if self.rounding == "stochastic" else {}
                new = round_to(new, self.storage, rounding=self.rounding, **kw)
                moved = upd != 0
                self.updates += int(moved.sum())
                self.lost += int((moved & (new == p)).sum())
            p.copy_(new)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
