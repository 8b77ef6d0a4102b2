"""``lowbit eval --methods hadamard``: a scheme's variant with block Hadamard rotations
(``lowbit.methods.hadamard``): each quantized linear weight rotated before rounding, its input
rotated in the forward pass, so the layer computes ``(x R) Q(W R)ᵀ``; and ``--methods
hadamard-fold`` / ``hadamard-fold+gptq``: the rotation folded offline into every value ->
output projection pair (``lowbit.methods.hadamard_fold``), then rounded to nearest or GPTQ'd
as the float model is, with no rotation at run time."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from lowbit.checkpoints.gguf.names import gguf_to_hf_name
from lowbit.checkpoints.readers import Checkpoint, ReplacedCheckpoint
from lowbit.checkpoints.streaming import open_model, plan_model
from lowbit.errors import LowbitError
from lowbit.evaluation._compare import Variant
from lowbit.methods.hadamard import rotate_rows, rotation_block
from lowbit.methods.hadamard_fold import (
    VOPair,
    check_fold_block,
    fold_v_o,
    head_dim_of,
    v_o_pairs,
)
from lowbit.models.build import build_model
from lowbit.models.hooks import attach_rotations
from lowbit.plans.plan import PrecisionPlan
from lowbit.plans.rules import action_label
from lowbit.quant.tensor import quantize

__all__ = ["fold_checkpoint", "fold_pairs", "folded_variant", "rotate_inputs", "rotated_variant"]


def rotate_inputs(model: Any, checkpoint: Any, blocks: Mapping[str, int]) -> list[str]:
    """Register forward pre-hooks rotating the inputs of the linear layers whose weights
    ``blocks`` names (checkpoint tensor name -> Hadamard block): ``x ↦ x R``
    (``lowbit.models.hooks.attach_rotations``, what ``load_model`` does for a rotated lowbit
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


def fold_checkpoint(checkpoint: Any, block: int) -> tuple[Checkpoint, dict[str, Any]]:
    """The checkpoint with the block Hadamard rotation folded into every value -> output
    projection pair (``lowbit.methods.hadamard_fold.fold_v_o``): it computes what the source
    computes, its output projections reading the attention output rotated.

    Args:
        checkpoint: a path, shipped model name or open checkpoint (GGUF names are read as
            transformers names them; value and output rows are never permuted there).
        block: the Hadamard block.

    Returns:
        ``(folded checkpoint, record)``; the record says ``kind`` (``block-hadamard``),
        ``where`` (``v_proj -> o_proj``), ``block`` and ``pairs`` (how many were folded).

    Raises:
        LowbitError: a family without an exact value -> output fold, a block that does not
            divide the head size.
    """
    ckpt = open_model(checkpoint)
    hf_of, pairs, head_dim = fold_pairs(ckpt, block)
    folded = fold_v_o(lambda n: ckpt.get(hf_of[n]), pairs, head_dim, block)
    record = {"kind": "block-hadamard", "where": "v_proj -> o_proj", "block": int(block),
              "pairs": len(pairs)}  # fmt: skip
    return ReplacedCheckpoint(ckpt, {hf_of[n]: a for n, a in folded.items()}), record


def fold_pairs(ckpt: Checkpoint, block: int) -> tuple[dict[str, str], list[VOPair], int]:
    """What :func:`fold_checkpoint` folds, checked without reading a tensor: transformers
    name -> checkpoint name, the value -> output pairs (transformers names) and the head size.

    Raises:
        LowbitError: as :func:`fold_checkpoint`.
    """
    hf_of = {}
    for name in ckpt.names():
        try:
            hf_of[gguf_to_hf_name(name, ckpt.config) if ckpt.format == "gguf" else name] = name
        except LowbitError:
            continue  # no transformers counterpart (rope_freqs ...): never a projection
    pairs = v_o_pairs(hf_of, (ckpt.config or {}).get("model_type"))
    head_dim = head_dim_of(ckpt.config)
    check_fold_block(head_dim, block)
    return hf_of, pairs, head_dim


def folded_variant(
    checkpoint: Any, plan: PrecisionPlan, spec: str, method: str,
    make: Callable[[Checkpoint], Variant],
) -> Variant:  # fmt: skip
    """``make``'s row of the checkpoint with the Hadamard block of ``plan``'s scheme folded
    into its value -> output pairs (:func:`fold_checkpoint`), named ``"{spec} {method}"``;
    its extra field ``fold`` is the fold's record.

    Raises:
        LowbitError: as :func:`fold_checkpoint`; a scheme without power-of-two groups along
            the input axis.
    """
    folded, record = fold_checkpoint(checkpoint, rotation_block(plan.default))
    v = make(folded)
    return dataclasses.replace(
        v,
        name=f"{spec} {method}",
        format=f"{v.format}, v->o block Hadamard {record['block']} folded",
        extra={**v.extra, "fold": record},
    )
