"""The MLX job: a model as an MLX folder that ``mlx_lm.load`` reads (``lowbit quantize
--out-format mlx``), rounded as ``mlx_lm.convert`` rounds or GPTQ'd onto the same affine grids.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from lowbit.calibration.data import Calibration
from lowbit.checkpoints.mlx.convert import RECIPES, gptq_targets, quantize_mlx
from lowbit.checkpoints.mlx.params import MLXParams
from lowbit.checkpoints.streaming import open_model
from lowbit.errors import LowbitError
from lowbit.jobs.gguf import gptq_onto
from lowbit.jobs.results import QuantizeResult
from lowbit.methods.gptq import GPTQ
from lowbit.quant.mlx import MODES

__all__ = ["mlx_params", "quantize_to_mlx"]


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
            f"--to {to!r} with --out-format mlx: an MLX mode ({', '.join(MODES)}) or one of "
            f"mlx-lm's mixed recipes ({', '.join(RECIPES)}); bits and groups are --q-bits and "
            "--q-group-size"
        )
    return MLXParams(mode=mode or "affine", bits=bits, group_size=group_size), recipe


def quantize_to_mlx(
    model: Any,
    out: str | os.PathLike[str],
    params: MLXParams | None = None,
    *,
    recipe: str | None = None,
    dtype: str | None = None,
    method: str | GPTQ = "rtn",
    calibration: Calibration | None = None,
    threads: int | None = None,
    compute: str = "fp32",
    overwrite: bool = False,
    copy_code: bool = False,
    progress: bool | None = None,
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
            :class:`~lowbit.methods.gptq.GPTQ`: GPTQ onto the affine grids.
        calibration, threads, compute: GPTQ's data, torch threads and forward precision.
        overwrite, copy_code, progress: as :func:`lowbit.quantize_model`.

    Raises:
        LowbitError: a method other than rtn/gptq, a family mlx-lm's loader is not checked
            against, an output that is an input.
    """
    start = time.perf_counter()
    if not isinstance(method, GPTQ) and method not in ("rtn", "gptq"):
        raise LowbitError(
            f"--method {method}: lowbit's MLX output rounds to nearest as mlx_lm.convert does, "
            "or with --method gptq onto the same affine grids"
        )
    params = params or MLXParams()
    out_path = Path(out)
    done = record = None
    seconds: dict[str, float] = {}
    if method != "rtn":
        if out_path.exists() and not overwrite:  # fail before minutes of calibration
            raise LowbitError(f"{out_path} exists; pass --overwrite to replace it")
        t0 = time.perf_counter()
        ckpt = open_model(model)
        targets = gptq_targets(ckpt, params, recipe=recipe, dtype=dtype)
        done, record = gptq_onto(
            ckpt, targets, False, gptq=method if isinstance(method, GPTQ) else GPTQ(),
            calibration=calibration, threads=threads, compute=compute, progress=progress,
        )  # fmt: skip
        seconds["calibration"] = time.perf_counter() - t0
        model = ckpt
    result = quantize_mlx(
        model, out_path, params, recipe=recipe, dtype=dtype, overwrite=overwrite,
        copy_code=copy_code, progress=progress, weights=done, method=record,
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
