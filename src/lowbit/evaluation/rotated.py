"""``lowbit eval --methods hadamard``: a scheme's variant with block Hadamard rotations
(``lowbit.methods.hadamard``): each quantized linear weight rotated before rounding, its input
rotated in the forward pass, so the layer computes ``(x R) Q(W R)ᵀ``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from lowbit.checkpoints.quantize_model import plan_model
from lowbit.evaluation._compare import Variant
from lowbit.methods.hadamard import rotate_rows, rotation_block
from lowbit.models.build import attach_rotations, build_model
from lowbit.plans.plan import PrecisionPlan
from lowbit.plans.rules import action_label
from lowbit.quant.tensor import quantize

__all__ = ["rotate_inputs", "rotated_variant"]


def rotate_inputs(model: Any, checkpoint: Any, blocks: Mapping[str, int]) -> list[str]:
    """Register forward pre-hooks rotating the inputs of the linear layers whose weights
    ``blocks`` names (checkpoint tensor name -> Hadamard block): ``x ↦ x R``
    (``lowbit.models.build.attach_rotations``, what ``load_model`` does for a rotated lowbit
    checkpoint).

    Hooks registered later (``--act``'s activation quantizers) see the rotated inputs, as a
    consumer that rotates before quantizing its activations does.

    Returns:
        The tensor names whose layers were hooked: all of ``blocks``.

    Raises:
        LowbitError: a rotated weight the model does not run as an ``nn.Linear`` (its input
            could not be rotated, so the rotated weight would be wrong).
    """
    attach_rotations(model, dict(blocks), checkpoint.format)
    return list(blocks)


def rotated_variant(checkpoint: Any, plan: PrecisionPlan, spec: str, progress: Any) -> Variant:
    """The model with ``plan``'s 2-D weights rotated, quantized and dequantized, and forward
    pre-hooks rotating their layers' inputs; a row named ``"{spec} hadamard"``.

    Raises:
        LowbitError: a scheme without power-of-two groups along the input axis.
    """
    applied = plan_model(checkpoint, plan)
    block = rotation_block(plan.default)
    weights: dict[str, np.ndarray] = {}
    rotated: dict[str, int] = {}
    qbytes = qnumel = 0
    for t in applied.quantized:
        w = np.asarray(checkpoint.get(t.name), dtype=np.float32)
        if w.ndim == 2 and w.shape[1] % block == 0:
            w = rotate_rows(w, block)
            rotated[t.name] = block
        qt = quantize(w, t.scheme)
        weights[t.name] = qt.dequantize(np.float32)
        qbytes += qt.nbytes
        qnumel += qt.numel
    model = build_model(checkpoint, weights=weights, progress=progress)
    del weights
    rotate_inputs(model, checkpoint, rotated)
    totals = applied.totals()
    return Variant(
        name=f"{spec} hadamard",
        format=f"{action_label(plan.default)}, block Hadamard {block}",
        model=model,
        bits_per_weight=qbytes * 8 / qnumel if qnumel else None,
        nbytes=totals["bytes"],
        source="memory",
        extra={"rotated_layers": len(rotated), "rotation_block": block},
    )
