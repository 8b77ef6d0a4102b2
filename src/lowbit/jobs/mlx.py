"""The MLX job: a model as an MLX folder that ``mlx_lm.load`` reads (``lowbit quantize
--out-format mlx``), rounded as ``mlx_lm.convert`` rounds, or GPTQ'd or AWQ'd onto the same affine grids.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lowbit.calibration.awq import awq_weights
from lowbit.calibration.data import Calibration
from lowbit.checkpoints.mlx.convert import RECIPES, gptq_targets, quantize_mlx
from lowbit.checkpoints.mlx.params import MLXParams
from lowbit.checkpoints.streaming import open_model
from lowbit.errors import LowbitError
from lowbit.jobs.gguf import gptq_onto
from lowbit.jobs.results import QuantizeResult
from lowbit.methods.awq import AWQ
from lowbit.methods.gptq import GPTQ
from lowbit.quant.mlx import MODES

__all__ = ["METHODS", "mlx_params", "quantize_to_mlx"]

#: the methods of the MLX output: mlx_lm.convert's rounding, or GPTQ / AWQ onto its grids
METHODS = ("rtn", "gptq", "awq")


def mlx_params(
    to: str | None = None,
    *,
    bits: int | None = None,
    group_size: int | None = None,
    mode: str | None = None,
) -> tuple[MLXParams, str | None]:
    """The MLX parameters and mixed recipe ``to`` (an MLX mode or one of mlx-lm's mixed
    recipes) and ``mlx_lm.convert``'s ``--q-bits/--q-group-size/--q-mode`` say.

    Raises:
        LowbitError: a ``to`` that is neither, a mode that contradicts it, parameters MLX does
            not hold.
    """
    recipe = None
    key = (to or "").strip().lower()
    if key in RECIPES:
        recipe = key
    elif key in MODES:
        if mode is not None and mode != key:
            raise LowbitError(f"--to {key} and --q-mode {mode} contradict each other")
        mode = key
    elif key:
        raise LowbitError(
            f"--to {to}: with --out-format mlx, --to is an mlx-lm recipe "
            f"({', '.join(RECIPES)}) or an MLX mode ({', '.join(MODES)}); bits and groups are "
            "--q-bits and --q-group-size"
        )
    return MLXParams(mode=mode or "affine", bits=bits, group_size=group_size), recipe


def check_scale_method(scale_method: str | None, method: Any) -> None:
    """``scale_method`` as the MLX output takes it: ``mse`` or ``absmax``, for GPTQ only.

    Raises:
        LowbitError: another scale method, or one beside round to nearest or AWQ.
    """
    if scale_method not in (None, "mse", "absmax"):
        raise LowbitError(
            f"--scale-method {scale_method} does not apply to --out-format mlx: GPTQ's group "
            "scales are searched (mse, the default) or MLX's edge rule (absmax)"
        )
    if scale_method is not None and (isinstance(method, AWQ) or method in ("rtn", "awq")):
        raise LowbitError(
            "--scale-method chooses GPTQ's MLX group scales (--method gptq); round to nearest "
            "and AWQ round as mx.quantize does"
        )


def quantize_to_mlx(
    model: Any,
    out: str | os.PathLike[str],
    params: MLXParams | None = None,
    *,
    recipe: str | None = None,
    dtype: str | None = None,
    method: str | GPTQ | AWQ = "rtn",
    calibration: Calibration | None = None,
    threads: int | None = None,
    compute: str = "fp32",
    overwrite: bool = False,
    copy_code: bool = False,
    progress: bool | None = None,
    modules: Mapping[str, MLXParams | None] | None = None,
    scale_method: str | None = None,
) -> QuantizeResult:
    """Write ``model`` as an MLX folder, the same bytes as ``lowbit quantize --out-format mlx``.

    Args:
        model: a path, a shipped model name or an open checkpoint.
        out: the folder to write.
        params: mode, bits and group size (default: affine, 4 bits, groups of 64, as
            ``mlx_lm.convert -q``); :func:`mlx_params` builds them from mlx-lm's words.
        recipe: one of mlx-lm's mixed recipes (``mixed_3_6`` ...).
        dtype: the model dtype (default: config.json's).
        method: ``"rtn"`` (``mx.quantize``'s bytes), ``"gptq"`` or a
            :class:`~lowbit.methods.gptq.GPTQ`: GPTQ onto the affine grids; ``"awq"`` or an
            :class:`~lowbit.methods.awq.AWQ`: AWQ's scales folded into the operations before
            (norms, ``v``, ``up``), each group clipped where it helps, rounded as
            ``mx.quantize`` rounds.
        calibration, threads, compute: the calibration data, torch threads and forward
            precision of GPTQ or AWQ.
        overwrite, copy_code, progress: as :func:`lowbit.quantize_model`.
        modules: module path -> its own params (a budget's grids, :func:`lowbit.jobs.mlx_budget.mlx_budget`).
        scale_method: GPTQ's group scales and biases: ``"mse"`` (default for GPTQ) searched
            for the least Hessian-weighted error, ``"absmax"`` MLX's edge rule (from the
            group's largest magnitude, as ``mx.quantize``). Round to nearest and AWQ use the
            edge rule (``mx.quantize``'s bytes).

    Raises:
        LowbitError: a method other than rtn/gptq/awq, a family mlx-lm's loader is not
            checked against, an output that is an input.
    """
    start = time.perf_counter()
    if not isinstance(method, GPTQ | AWQ) and method not in METHODS:
        raise LowbitError(
            f"--method {method}: lowbit's MLX output rounds to nearest as mlx_lm.convert does, "
            "or with --method gptq or awq onto the same affine grids"
        )
    check_scale_method(scale_method, method)
    params = params or MLXParams()
    out_path = Path(out)
    done = record = None
    seconds: dict[str, float] = {}
    if method != "rtn":
        if out_path.exists() and not overwrite:  # fail before minutes of calibration
            raise LowbitError(f"{out_path} exists; pass --overwrite to replace it")
        t0 = time.perf_counter()
        ckpt = open_model(model)
        search = not (isinstance(method, AWQ) or method == "awq") and scale_method != "absmax"
        targets = gptq_targets(
            ckpt, params, recipe=recipe, dtype=dtype, modules=modules, search=search
        )
        if isinstance(method, AWQ) or method == "awq":
            awq = method if isinstance(method, AWQ) else AWQ()
            done, record, ckpt = _awq_onto(ckpt, targets, awq, calibration, threads, compute,
                                           progress)  # fmt: skip
        else:
            done, record = gptq_onto(
                ckpt, targets, False, gptq=method if isinstance(method, GPTQ) else GPTQ(),
                calibration=calibration, threads=threads, compute=compute, progress=progress,
            )  # fmt: skip
        seconds["calibration"] = time.perf_counter() - t0
        model = ckpt
    result = quantize_mlx(
        model, out_path, params, recipe=recipe, dtype=dtype, overwrite=overwrite,
        copy_code=copy_code, progress=progress, weights=done, method=record, modules=modules,
    )  # fmt: skip
    seconds["write"] = float(result["seconds"])
    seconds["total"] = time.perf_counter() - start
    return QuantizeResult(
        details=result,
        out=out_path,
        out_format="mlx",
        source=str(result.get("source", "")),
        bytes=int(result["bytes"]),
        tensors=len(result.get("quantized", {})),
        seconds=seconds,
        method=record,
    )


def _awq_onto(
    ckpt: Any, targets: dict[str, Any], awq: AWQ, calibration: Calibration | None,
    threads: int | None, compute: str, progress: bool | None,
) -> tuple[dict[str, Any], dict[str, Any], Any]:  # fmt: skip
    """AWQ of ``targets`` onto their MLX grids: the weights it rounded, its record, and the
    source with its folds applied (norms and the layers it did not round, to write from)."""
    run = awq_weights(
        ckpt, None, calibration or Calibration(), awq, threads=threads, progress=progress,
        compute=compute, targets=targets,
    )  # fmt: skip
    done = {n: w for n, w in run.weights.items() if run.methods.get(n) == "awq"}
    errs = [run.layers[n] for n in done if n in run.layers]
    mean = {k: float(np.mean([e[k] for e in errs])) if errs else 0.0 for k in ("rtn", "awq")}
    record = {
        **awq.to_dict(),
        "awq_tensors": len(done),
        "mean_error": mean,
        "layers": run.layers,
        "folds": run.folds,
        "calibration": run.calibration,
        "seconds": run.seconds,
    }
    return done, record, run.checkpoint(ckpt)
