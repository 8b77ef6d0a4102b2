"""The MLX budget job: ``lowbit quantize MODEL --out-format mlx --budget BPW|--size BYTES``.

Each module the MLX output quantizes is tried on every candidate grid (MLX's rounding in the
model dtype, the rest of the model in float; the damage is the mean KL of the next-token
distributions over the scan windows or, with ``measure="block"``, its block-local estimate,
as the GGUF budget measures), the damages and the exact bytes of each grid are solved for the
budget (:mod:`lowbit.checkpoints.mlx.budget`), and the folder is written with one config.json entry per module, rounded to nearest or, with
``method``, GPTQ'd or AWQ'd onto the chosen grids.

:func:`mlx_job` is :func:`lowbit.quantize_model`'s route for ``out_format="mlx"``: a budget
(``size``/``budget``) to :func:`mlx_budget`, anything else to
:func:`lowbit.jobs.mlx.quantize_to_mlx`.

>>> mlx_budget("smollm2", "smol-4.5", bits_per_weight=4.5)        # doctest: +SKIP
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lowbit._progress import progress_bar
from lowbit.calibration.data import Calibration
from lowbit.checkpoints.io.outputs import check_output
from lowbit.checkpoints.mlx.budget import (
    DEFAULT_CANDIDATES,
    budget_options,
    parse_candidates,
    solve_mlx,
)
from lowbit.checkpoints.mlx.params import MLXParams
from lowbit.checkpoints.mlx.writer import model_dtype
from lowbit.checkpoints.streaming import check_unrotated, open_model
from lowbit.checkpoints.tokenizer import build_tokenizer
from lowbit.errors import LowbitError
from lowbit.evaluation.gguf_sensitivity import gguf_block_sensitivity, gguf_sensitivity
from lowbit.evaluation.scan_samples import scan_samples
from lowbit.jobs.mlx import check_scale_method, mlx_params, quantize_to_mlx
from lowbit.jobs.results import QuantizeResult
from lowbit.jobs.sources import open_source
from lowbit.methods.awq import AWQ
from lowbit.methods.gptq import GPTQ
from lowbit.quant import mlx as Q

__all__ = ["mlx_budget", "mlx_job"]


def _rounder(dt: np.dtype) -> Callable[[np.ndarray, str, Any], np.ndarray]:
    """A trial's rounding: ``mx.quantize`` of the weight in the model dtype, decoded."""

    def roundtrip(w: np.ndarray, name: str, _vector: Any) -> np.ndarray:
        (p,) = parse_candidates([name])
        q = Q.quantize(np.asarray(w, np.float32).astype(dt), group_size=p.group_size, bits=p.bits)
        return Q.dequantize(*q, group_size=p.group_size, bits=p.bits).astype(np.float32)

    return roundtrip


def mlx_budget(
    model: Any,
    out: str | os.PathLike[str] | None = None,
    *,
    size: int | None = None,
    bits_per_weight: float | None = None,
    candidates: Sequence[str] | None = None,
    dtype: str | None = None,
    method: str | GPTQ | AWQ = "rtn",
    calibration: Calibration | None = None,
    scan_text: str = "default",
    scan_samples_count: int | None = None,
    scan_length: int = 512,
    overwrite: bool = False,
    threads: int | None = None,
    compute: str = "fp32",
    progress: bool | None = None,
    dry_run: bool = False,
    measure: str = "exact",
    copy_code: bool = False,
    scale_method: str | None = None,
) -> QuantizeResult:
    """Write ``model`` as an MLX folder whose every quantized module has the affine grid of
    least measured damage that keeps the folder within the budget.

    Args:
        model: a path, shipped model name or open checkpoint (a causal LM lowbit builds).
        out: the folder (needed unless ``dry_run``).
        size: the folder's tensor bytes at most (``total_size`` of its index); or
        bits_per_weight: the quantized modules' stored bits per weight at most.
        candidates: grid names ``<bits>bit-g<group>`` (default
            :data:`~lowbit.checkpoints.mlx.budget.DEFAULT_CANDIDATES`).
        dtype: the model dtype (default: config.json's).
        method: ``"rtn"`` (``mx.quantize``'s bytes on the chosen grids), ``"gptq"``/``"awq"``
            or their settings: onto the chosen grids, after the trials.
        calibration: GPTQ's or AWQ's data.
        scan_text, scan_samples_count, scan_length: the trials' text, windows and tokens per
            window.
        scale_method: GPTQ's group scales, as :func:`~lowbit.jobs.mlx.quantize_to_mlx`'s.
        overwrite, threads, compute, progress, copy_code: as :func:`lowbit.quantize_model`.
        dry_run: solve and report, write nothing.
        measure: ``exact`` (default): each trial runs the model from the module's block to
            the logits (mean KL); ``block``: each trial runs the module's block alone, its
            output error weighted by the next-token Fisher at that block's output
            (:mod:`lowbit.evaluation.block_sensitivity`: one block forward per trial, memory
            of one block), as :func:`lowbit.jobs.gguf.gguf_budget` measures.

    Returns:
        A :class:`~lowbit.jobs.results.QuantizeResult`; ``details["plan"]`` holds the chosen
        grids, the predicted bytes and damage, ``details["damages"]`` every trial.

    Raises:
        LowbitError: both or neither budget, bad candidates, a budget below the smallest
            choice, a mixture of experts, an unknown measure, an existing output (without
            ``overwrite``).
    """
    start = time.perf_counter()
    if (size is None) == (bits_per_weight is None):
        raise LowbitError("give size (bytes) or bits_per_weight, one of them")
    if measure not in ("exact", "block"):
        raise LowbitError(f"measure must be 'exact' or 'block', got {measure!r}")
    check_scale_method(scale_method, method)  # before the trials, not after
    cands = parse_candidates(candidates or DEFAULT_CANDIDATES)
    ckpt = open_model(model)
    check_unrotated(ckpt)
    if out is None and not dry_run:
        raise LowbitError("say where to write the MLX folder: out='model-mlx-budget'")
    if out is not None and not dry_run:
        check_output(Path(out), overwrite=overwrite, kind="dir", inputs=[ckpt.path])
    dt = model_dtype(ckpt, dtype)
    options = budget_options(ckpt, cands)
    calib = scan_samples(
        "causal", build_tokenizer(ckpt), scan_text, samples=scan_samples_count, length=scan_length
    )
    trials = {n: {t: None for t in opts} for n, opts in options.items()}
    total = sum(len(v) for v in trials.values())
    label = "MLX block trials" if measure == "block" else "MLX trials"
    measured = gguf_block_sensitivity if measure == "block" else gguf_sensitivity
    with progress_bar(total, progress, label, "trial") as bar:
        tick: Callable[[int, int], None] = lambda done, _total: bar.update(done - bar.n)  # noqa: E731
        sens = measured(ckpt, trials, calib, progress=tick, compute=compute, rounder=_rounder(dt))
    t0 = time.perf_counter()
    plan = solve_mlx(ckpt, options, sens.damages, dt, size=size, bits_per_weight=bits_per_weight)
    seconds = {**sens.seconds, "solve": time.perf_counter() - t0}
    details: dict[str, Any] = {
        "source": str(ckpt.path),
        "candidates": [f"{p.bits}bit-g{p.group_size}" for p in cands],
        "calibration": sens.calibration,
        "metric": sens.metric,
        "measure": measure,
        "trials": total,
        "plan": plan.to_dict(),
        "damages": sens.damages,
    }
    if dry_run:
        seconds["total"] = time.perf_counter() - start
        return QuantizeResult(details={**details, "seconds": seconds}, out=None,
                              out_format="mlx", source=str(ckpt.path), bytes=plan.tensor_bytes,
                              tensors=len(plan.modules), seconds=seconds, dry_run=True)  # fmt: skip
    modules: dict[str, MLXParams | None] = dict(plan.modules)
    res = quantize_to_mlx(
        ckpt, Path(out), plan.default, dtype=dtype, method=method,  # type: ignore[arg-type]
        calibration=calibration, threads=threads, compute=compute, overwrite=overwrite,
        copy_code=copy_code, progress=progress, modules=modules, scale_method=scale_method,
    )  # fmt: skip
    seconds.update({k: v for k, v in res.seconds.items() if k != "total"})
    seconds["total"] = time.perf_counter() - start
    details = {**res.details, **details}
    return QuantizeResult(
        details=details, out=res.out, out_format="mlx", source=res.source, bytes=res.bytes,
        tensors=res.tensors, seconds=seconds, method=res.method,
    )  # fmt: skip


def mlx_job(
    model: Any,
    to: Any,
    out: str | os.PathLike[str] | None,
    *,
    method: Any,
    calibration: Calibration,
    scan_text: str,
    bits: int | None,
    group_size: int | None,
    size: int | None,
    budget: float | None,
    candidates: Sequence[str] | None,
    scan_samples: int | None,
    scan_length: int,
    tokenizer: Any,
    threads: int | None,
    compute: str,
    overwrite: bool,
    copy_code: bool,
    progress: bool | None,
    dry_run: bool,
    scale_method: str | None = None,
) -> QuantizeResult:
    """:func:`lowbit.quantize_model` with ``out_format="mlx"`` (its arguments, ``budget`` the
    bits per weight): a budget to :func:`mlx_budget`, otherwise ``to`` (an MLX mode or mlx-lm
    mixed recipe), ``bits`` and ``group_size`` to :func:`lowbit.jobs.mlx.quantize_to_mlx`.

    Raises:
        LowbitError: no ``out`` (a budget's dry run needs none), ``to`` neither an MLX mode nor a
            recipe, ``to``/``bits``/``group_size`` with a budget, a dry run without one.
    """
    budgeted = bool(size or budget)
    if out is None and not (budgeted and dry_run):
        raise LowbitError("say where to write the MLX folder: out='model-mlx'")
    if not (to is None or isinstance(to, str)):
        raise LowbitError("to= with out_format='mlx': an MLX mode or mlx-lm mixed recipe")
    if budgeted and (to is not None or bits or group_size):
        raise LowbitError(
            "size/budget with out_format='mlx' choose each module's bits and groups (from "
            "candidates=, e.g. ['3bit-g64', '4bit-g64', '6bit-g64']); drop to=/bits=/group_size="
        )
    if dry_run and not budgeted:
        raise LowbitError("dry_run with out_format='mlx' shows a budget's plan (size=/budget=)")
    params, recipe = mlx_params(to, bits=bits, group_size=group_size)
    with open_source(model, tokenizer=tokenizer, near=None if out is None else Path(out)) as ckpt:
        if budgeted:
            return mlx_budget(
                ckpt, out, size=size, bits_per_weight=budget, candidates=candidates,
                method=method, calibration=calibration, scan_text=scan_text,
                scan_samples_count=scan_samples, scan_length=scan_length, overwrite=overwrite,
                threads=threads, compute=compute, progress=progress, dry_run=dry_run,
                copy_code=copy_code, scale_method=scale_method,
            )  # fmt: skip
        assert out is not None  # refused above
        return quantize_to_mlx(
            ckpt, out, params, recipe=recipe, method=method, calibration=calibration,
            threads=threads, compute=compute, overwrite=overwrite, copy_code=copy_code,
            progress=progress, scale_method=scale_method,
        )  # fmt: skip
