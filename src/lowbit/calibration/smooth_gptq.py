"""SmoothQuant's folds, then GPTQ of the folded model: llm-compressor's SmoothQuant + GPTQ recipe
(``lowbit quantize --smooth --method gptq``; ``lowbit eval``'s ``smoothquant+gptq`` rows build
the same two steps)."""

from __future__ import annotations

import os
from typing import Any

from lowbit.calibration.awq import awq_weights
from lowbit.calibration.calibrated import CalibratedWeights, _calibration, calibrated_weights
from lowbit.calibration.data import Calibration
from lowbit.checkpoints.readers import Checkpoint
from lowbit.checkpoints.streaming import open_model
from lowbit.methods.gptq import GPTQ
from lowbit.methods.smoothquant import SmoothQuant
from lowbit.plans.plan import PrecisionPlan

__all__ = ["smoothquant_gptq_weights"]


def smoothquant_gptq_weights(
    model: str | os.PathLike[str] | Checkpoint | None,
    plan: PrecisionPlan,
    smooth: SmoothQuant,
    gptq: GPTQ,
    calibration: Calibration | str | os.PathLike[str] | None = None,
    *,
    threads: int | None = None,
    progress: bool | None = None,
    compute: str = "fp32",
) -> CalibratedWeights:
    """SmoothQuant's folds, then GPTQ of the folded model (llm-compressor's SmoothQuant + GPTQ
    recipe; ``lowbit quantize --smooth --method gptq``), both on ``calibration``.

    SmoothQuant's search runs as :func:`calibrated_weights` runs it; its folds are then
    applied to the float weights (``AWQRun.folded_checkpoint``: the same function as the
    source) and GPTQ quantizes every planned tensor of that folded model.

    Returns:
        A :class:`CalibratedWeights` whose checkpoint is the folded model and whose record
        is GPTQ's with a ``smoothquant`` entry (its settings, folds, folded tensors, seconds).

    Raises:
        LowbitError: as :func:`calibrated_weights` (a plan without one activation format).
    """
    calib = _calibration(calibration)
    ckpt = open_model(model)
    kw: dict[str, Any] = {"threads": threads, "progress": progress, "compute": compute}
    sq = awq_weights(ckpt, plan, calib, smooth, default_method="awq", **kw)
    run = calibrated_weights(sq.folded_checkpoint(ckpt), plan, gptq, calib, **kw)
    folded = run.checkpoint
    record = {
        **run.record,
        "smoothquant": {
            **smooth.to_dict(),
            "seconds": sq.seconds,
            "folded_tensors": sorted(getattr(folded, "replaced", {})),
            "folds": sq.folds,
        },
    }
    return CalibratedWeights(folded, run.weights, record)
