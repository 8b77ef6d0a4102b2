"""Scaling for low-precision training: dynamic loss scaling and per-tensor FP8 scaling.

* :class:`LossScaler` multiplies the loss before the backward pass so that FP16 gradients
  stay above FP16's underflow threshold, and skips (and backs off) on inf/NaN gradients
  (Micikevicius et al., "Mixed Precision Training", arXiv 1710.03740, §3.2; the growth and
  backoff schedule of ``torch.amp.GradScaler``).
* :class:`DelayedScaling` chooses each FP8 tensor's scale from the absolute maxima of the
  previous steps (an amax history), as NVIDIA Transformer Engine's ``DelayedScaling``
  recipe does; :func:`current_scaling` uses the tensor's own amax; :func:`mx_scaling`
  gives every block of 32 values its own power-of-two scale (OCP MX v1.0).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from lowbit.errors import LowbitError
from lowbit.formats.base import Format
from lowbit.torch import Quantizer, pow2_at_least


@dataclass
class LossScaler:
    """Dynamic (or static) loss scaling with skipped-step accounting.

    Each step: ``backward(scaler.scale_loss(loss))``; ``found = scaler.unscale_(params)``
    divides the gradients by the scale and reports any inf/NaN; ``scaler.update(found)``
    returns whether to apply the optimizer step. On inf/NaN the step is skipped and the
    scale multiplied by ``backoff_factor``; after ``growth_interval`` consecutive good
    steps it is multiplied by ``growth_factor``. ``dynamic=False`` keeps the scale fixed
    (steps with inf/NaN are still skipped).

    Args:
        init_scale: the first scale (2**16, as torch's GradScaler).
        growth_factor: multiplier after ``growth_interval`` good steps.
        backoff_factor: multiplier after a step with inf/NaN gradients.
        growth_interval: good steps between growths.
        dynamic: adjust the scale (True) or keep it.
        min_scale, max_scale: bounds of the scale.
    """

    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    dynamic: bool = True
    min_scale: float = 2.0**-24
    max_scale: float = 2.0**24
    scale: float = field(init=False)
    good_steps: int = field(init=False, default=0)
    skipped: int = field(init=False, default=0)
    steps: int = field(init=False, default=0)
    history: list[float] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if not (self.init_scale > 0 and math.isfinite(self.init_scale)):
            raise LowbitError(f"init_scale must be positive and finite, got {self.init_scale}")
        if self.growth_factor < 1 or not 0 < self.backoff_factor <= 1:
            raise LowbitError(
                "growth_factor must be >= 1 and backoff_factor in (0, 1] "
                f"(got {self.growth_factor}, {self.backoff_factor})"
            )
        if self.growth_interval < 1:
            raise LowbitError(f"growth_interval must be >= 1, got {self.growth_interval}")
        self.scale = float(self.init_scale)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * scale``."""
        return loss * self.scale

    def unscale_(self, params: Iterable[torch.nn.Parameter]) -> bool:
        """Divide every gradient by the scale in place; return whether any is inf/NaN."""
        found = False
        inv = 1.0 / self.scale
        for p in params:
            if p.grad is None:
                continue
            p.grad.mul_(inv)
            if not found and not bool(torch.isfinite(p.grad).all()):
                found = True
        return found

    def update(self, found_inf: bool) -> bool:
        """Advance the schedule after a step; True if the optimizer step should be applied."""
        self.steps += 1
        self.history.append(self.scale)
        if found_inf:
            self.skipped += 1
            self.good_steps = 0
            if self.dynamic:
                self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            return False
        self.good_steps += 1
        if self.dynamic and self.good_steps >= self.growth_interval:
            self.scale = min(self.scale * self.growth_factor, self.max_scale)
            self.good_steps = 0
        return True

    def state(self) -> dict[str, Any]:
        """JSON-able summary: current scale, skipped and total steps."""
        return {"scale": self.scale, "skipped": self.skipped, "steps": self.steps}


class DelayedScaling(Quantizer):
    """Per-tensor FP8 scaling from an amax history (Transformer Engine's delayed scaling).

    Each call rounds ``x / scale`` to the format, where ``scale`` was chosen *before* this
    call from the absolute maxima recorded by previous calls; then ``amax(x)`` is
    appended to the history (oldest dropped beyond ``history_len``) and the next scale is
    computed: ``amax_h = max(history)`` (``amax_compute="max"``) or the latest entry
    (``"most_recent"``), and ``scale = 2**ceil(log2(amax_h / fmt.max)) * 2**margin`` (the
    smallest power of two that fits ``amax_h`` under ``fmt.max / 2**margin``; exact).
    Values beyond the range saturate to ±max (the delayed scale lags a growing tensor).
    The first call, with an empty history, uses its own amax (current scaling). A
    non-finite amax is not recorded, and an all-zero tensor leaves the scale unchanged.

    Args:
        fmt: the FP8 (or any) format.
        history_len: how many past amax values to keep (>= 1).
        amax_compute: ``"max"`` or ``"most_recent"``.
        margin: headroom in powers of two.
        count: counters to keep (as :class:`lowbit.torch.Quantizer`).
    """

    def __init__(
        self,
        fmt: str | Format,
        *,
        history_len: int = 16,
        amax_compute: str = "max",
        margin: int = 0,
        count: bool | str = True,
    ) -> None:
        super().__init__(fmt, scaling="pow2", margin=margin, count=count)
        if history_len < 1:
            raise LowbitError(f"history_len must be >= 1, got {history_len}")
        if amax_compute not in ("max", "most_recent"):
            raise LowbitError(
                f"unknown amax_compute {amax_compute!r}; allowed: 'max', 'most_recent'"
            )
        self.history_len = history_len
        self.amax_compute = amax_compute
        self.history: deque[float] = deque(maxlen=history_len)
        self.scale: float | None = None

    def __repr__(self) -> str:
        return (
            f"DelayedScaling({self.format.name!r}, history_len={self.history_len}, "
            f"amax_compute={self.amax_compute!r}, margin={self.margin})"
        )

    def _scale_from(self, amax: float) -> float:
        t = torch.tensor(amax / float(self.format.max), dtype=torch.float64)
        return float(pow2_at_least(t)) * 2.0**self.margin

    def record(self, amax: float) -> None:
        """Append an amax to the history and recompute the scale the next call will use."""
        if not math.isfinite(amax):
            return
        self.history.append(amax)
        h = max(self.history) if self.amax_compute == "max" else self.history[-1]
        if h > 0:
            self.scale = self._scale_from(h)

    def scale_for(self, amax: torch.Tensor) -> torch.Tensor:
        a = float(amax)
        s = self.scale
        if s is None:  # nothing recorded yet: this tensor's own amax
            s = self._scale_from(a) if a > 0 and math.isfinite(a) else 1.0
        if not self.frozen:
            self.record(a)
        return torch.full_like(amax, s)


def current_scaling(fmt: str | Format, *, margin: int = 0, count: bool | str = True) -> Quantizer:
    """Per-tensor scaling from the tensor's own amax (power of two, exact)."""
    return Quantizer(fmt, scaling="pow2", margin=margin, count=count)


def mx_scaling(fmt: str | Format, *, block_size: int = 32, count: bool | str = True) -> Quantizer:
    """OCP MX block scaling: one E8M0 power-of-two scale per ``block_size`` values of the last dim."""
    return Quantizer(fmt, scaling="mx", group_size=block_size, count=count)


def set_frozen(model: torch.nn.Module, frozen: bool) -> None:
    """Stop (or resume) every quantizer of ``model`` recording: amax histories and counters.

    Evaluation passes should not move the scales training uses, nor add to its counts.
    """
    from lowbit.torch import EmulatedLinear, EmulatedMatMul

    for mod in model.modules():
        if isinstance(mod, (EmulatedLinear, EmulatedMatMul)):
            qs = [q for _, q in mod.roles.items()]
            if isinstance(mod, EmulatedMatMul) and mod.rhs is not None:
                qs.append(mod.rhs)
            for q in qs:
                if isinstance(q, Quantizer):
                    q.frozen = frozen
