"""``lowbit eval``'s calibrated rows: a model quantized by GPTQ, AWQ or SmoothQuant, as one :class:`Variant`."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

import numpy as np

from lowbit.calibration.awq import awq_weights
from lowbit.calibration.blocks import _tensors
from lowbit.calibration.gptq import gptq_weights
from lowbit.checkpoints.streaming import open_model, plan_model
from lowbit.errors import LowbitError
from lowbit.evaluation._compare import Variant
from lowbit.evaluation.rotated import rotate_inputs
from lowbit.methods.awq import AWQ
from lowbit.methods.gptq import GPTQ
from lowbit.methods.mr_gptq import RotatedTensor
from lowbit.methods.smoothquant import SmoothQuant
from lowbit.models.build import build_model
from lowbit.plans.plan import PrecisionPlan
from lowbit.plans.rules import action_label

__all__ = [
    "awq_variant",
    "gptq_variant",
    "smooth_gptq_variant",
    "variant_plan",
]


def variant_plan(spec: str) -> PrecisionPlan:
    """The plan an ``eval --schemes`` entry quantizes with: ``lowbit quantize --to SPEC``'s
    (the scheme string read by :func:`lowbit.quant.scheme_text.parse_scheme`).

    Raises:
        LowbitError: a bad scheme string, or ``keep`` (not a variant).
    """
    plan = PrecisionPlan.uniform(spec)
    if plan.default is None:
        raise LowbitError(f"--schemes {spec!r}: 'keep' is the original, not a variant")
    return plan


def gptq_variant(
    checkpoint: Any,
    spec: str,
    calibration: Any = None,
    method: Any = None,
    *,
    avoid_tokens: int = 0,
    exclude: Collection[str] = (),
    threads: int | None = None,
    progress: bool | None = None,
    compute: str = "fp32",
) -> Any:
    """A ``lowbit eval`` row: the model with ``spec``'s tensors quantized by GPTQ
    (``compute``: the precision of its calibration's forward passes, as ``gptq_weights``).

    Returns:
        A :class:`lowbit.evaluation.variants.Variant` named ``"{spec} gptq"`` (``"{spec}
        hadamard+gptq"`` for :class:`~lowbit.methods.mr_gptq.MRGPTQ`: its weights in the
        rotated basis, its layers' inputs rotated by forward pre-hooks); its extra fields
        say how it was calibrated, the seconds per phase and the mean layer-output error of
        round-to-nearest and of GPTQ on the calibration data.
    """

    method = GPTQ() if method is None else method
    plan = variant_plan(spec)
    run = gptq_weights(
        checkpoint,
        plan,
        calibration,
        method,
        avoid_tokens=avoid_tokens,
        exclude=exclude,
        threads=threads,
        progress=progress,
        compute=compute,
    )
    # MR-GPTQ's weights stay in the rotated basis, their layers' inputs rotated online: as a
    # consumer computes them, so --act quantizes the rotated activations
    rotated = {n: qt.block for n, qt in run.weights.items() if isinstance(qt, RotatedTensor)}
    deq = {
        n: (qt.rotated if n in rotated else qt).dequantize(np.float32)
        for n, qt in run.weights.items()
    }
    model = build_model(checkpoint, weights=deq, progress=progress)
    del deq
    hooked = rotate_inputs(model, open_model(checkpoint), rotated) if rotated else []
    totals = plan.apply(_tensors(checkpoint)).totals()
    errs = list(run.layers.values())
    return Variant(
        name=f"{spec} {method.name}",
        format=action_label(plan.default),
        model=model,
        bits_per_weight=_bits_per_weight(run.weights),
        nbytes=totals["bytes"],
        source="memory",
        extra={
            "method": {**method.to_dict(), "sequential": run.sequential},
            "quantized_tensors": totals["quantized"],
            "gptq_tensors": sum(m == "gptq" for m in run.methods.values()),
            "calibration": run.calibration,
            "phase_seconds": run.seconds,
            "phase_cpu_seconds": run.cpu_seconds,
            "layer_error_rtn": _mean_error(errs, "rtn"),
            "layer_error_gptq": _mean_error(errs, "gptq"),
            **(
                {"rotated_layers": len(hooked), "rotation_block": sorted(set(rotated.values()))}
                if rotated
                else {}
            ),
        },
    )


def awq_variant(
    checkpoint: Any,
    spec: str,
    calibration: Any = None,
    method: Any = None,
    *,
    avoid_tokens: int = 0,
    exclude: Collection[str] = (),
    threads: int | None = None,
    progress: bool | None = None,
    compute: str = "fp32",
) -> Any:
    """A ``lowbit eval`` row: the model with ``spec``'s tensors quantized by AWQ, or rounded
    after SmoothQuant's folds (``compute``: as :func:`gptq_variant`).

    Returns:
        A :class:`~lowbit.evaluation._compare.Variant` named ``"{spec} awq"`` or ``"{spec}
        smoothquant"``; its extra fields say how it was calibrated, the seconds per phase,
        the folds and the mean layer-output error of round to nearest and of the method.
    """
    method = AWQ() if method is None else method
    plan = PrecisionPlan.uniform(spec)
    run = awq_weights(
        checkpoint, plan, calibration, method, avoid_tokens=avoid_tokens, exclude=exclude,
        threads=threads, progress=progress, compute=compute,
    )  # fmt: skip
    ckpt = open_model(checkpoint)
    model = build_model(ckpt, weights=run.model_weights(), progress=progress)
    totals = plan_model(ckpt, plan).totals()
    errs = list(run.layers.values())
    done = [f for f in run.folds if "skipped" not in f]
    return Variant(
        name=f"{spec} {method.name}",
        format=action_label(plan.default),
        model=model,
        bits_per_weight=_bits_per_weight(run.weights),
        nbytes=totals["bytes"],
        source="memory",
        extra={
            "method": method.to_dict(),
            "quantized_tensors": totals["quantized"],
            "method_tensors": sum(m == method.name for m in run.methods.values()),
            "folds": len(done),
            "folds_skipped": sorted({f["skipped"] for f in run.folds if "skipped" in f}),
            "calibration": run.calibration,
            "phase_seconds": run.seconds,
            "layer_error_rtn": _mean_error(errs, "rtn"),
            "layer_error_method": _mean_error(errs, method.name),
        },
    )


def smooth_gptq_variant(
    checkpoint: Any,
    spec: str,
    calibration: Any = None,
    method: Any = None,
    *,
    avoid_tokens: int = 0,
    exclude: Collection[str] = (),
    threads: int | None = None,
    progress: bool | None = None,
    compute: str = "fp32",
) -> Any:
    """A ``lowbit eval`` row: SmoothQuant's folds (its α search on ``calibration``), then
    GPTQ of the folded model's ``spec`` tensors on the same calibration data — llm-compressor's
    SmoothQuant + GPTQ recipe. ``method``: ``(SmoothQuant, GPTQ)``.

    Returns:
        A :class:`~lowbit.evaluation._compare.Variant` named ``"{spec} smoothquant+gptq"``:
        :func:`gptq_variant`'s extra fields and the folds made.
    """
    smooth, gptq = method if method is not None else (SmoothQuant(), GPTQ())
    kw: dict[str, Any] = {"avoid_tokens": avoid_tokens, "exclude": exclude,
                          "threads": threads, "progress": progress, "compute": compute}  # fmt: skip
    run = awq_weights(checkpoint, PrecisionPlan.uniform(spec), calibration, smooth, **kw)
    v = gptq_variant(run.folded_checkpoint(checkpoint), spec, calibration, gptq, **kw)
    done = [f for f in run.folds if "skipped" not in f]
    extra = {**v.extra, "smoothquant": smooth.to_dict(), "folds": len(done),
             "smoothquant_seconds": run.seconds}  # fmt: skip
    return dataclasses.replace(v, name=f"{spec} smoothquant+gptq", extra=extra)


def _bits_per_weight(weights: dict[str, Any]) -> float | None:
    """Stored bits per weight of the quantized tensors, scales included (None: none)."""
    nbytes = sum(qt.nbytes for qt in weights.values())
    numel = sum(qt.numel for qt in weights.values())
    return nbytes * 8 / numel if numel else None


def _mean_error(errs: list[dict[str, float]], key: str) -> float | None:
    """The mean layer-output error of one rounding (``rtn``, ``gptq``, ...) over the layers."""
    return float(np.mean([e[key] for e in errs])) if errs else None
