"""How much each tensor costs the model in each GGUF block type: the input to a GGUF budget.

The GGUF counterpart of :mod:`lowbit.evaluation.sensitivity`'s exact measure: for every tensor
llama-quantize would quantize and every type it may become
(:func:`lowbit.checkpoints.gguf.budget.budget_options`), the tensor alone is quantized with
llama.cpp's bytes (:func:`lowbit.ggml.blocks.quantize`, with its importance vector when
given) and decoded, the model runs with it, and the damage is the mean
KL(original || trial) of the next-token distributions over the calibration windows.

Trials reuse the scan's runner (:mod:`lowbit.evaluation._sensitivity_runner`): a tensor inside
block ``b`` runs blocks ``b..end`` from the cached inputs. The output head is special: the
runner's shortcut holds the reference head's weights, so a trial that changes them
(``output.weight``, or a token embedding tied to it) runs the whole model and compares its
log-probabilities with the original's, computed from the original head input kept once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lowbit._progress import Progress, step_reporter
from lowbit._results import TableView
from lowbit.checkpoints.readers import Checkpoint
from lowbit.errors import LowbitError
from lowbit.evaluation._sensitivity_runner import Runner, TensorWeights, block_of
from lowbit.evaluation.block_sensitivity import BLOCK_METRIC, block_damages
from lowbit.evaluation.scan_samples import ScanSamples
from lowbit.ggml import blocks
from lowbit.models._compute import compute_context, resolve_compute
from lowbit.models.build import build_model

__all__ = ["GgufSensitivity", "gguf_block_sensitivity", "gguf_sensitivity", "roundtrip"]

_CHUNK = 512  # positions per log-softmax of a head trial


def roundtrip(w: np.ndarray, t: str, vector: np.ndarray | None = None) -> np.ndarray:
    """``w`` stored as GGUF type ``t`` and read back (float32), llama.cpp's bytes; a 3-D
    tensor's importance vector holds one row of weights per expert."""
    w = np.asarray(w, dtype=np.float32)
    if t == "F16":
        return w.astype(np.float16).astype(np.float32)
    if vector is not None and w.ndim == 3 and vector.size == w.shape[0] * w.shape[-1]:
        per = vector.reshape(w.shape[0], w.shape[-1])
        return np.stack([roundtrip(w[e], t, per[e]) for e in range(w.shape[0])])
    q = blocks.quantize(w, t, imatrix=vector)
    return blocks.dequantize(q, t).reshape(w.shape)


@dataclass(repr=False)
class GgufSensitivity(TableView):
    """Measured damages: ``{tensor: {type: mean KL, nats}}``, and where the time went (a short
    repr, ``to_json``, ``to_pandas`` and a Jupyter table of one row per trial)."""

    damages: dict[str, dict[str, float]]
    calibration: str
    metric: str = "mean KL(original || trial) of next-token distributions, nats"
    seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "calibration": self.calibration,
            "metric": self.metric,
            "seconds": dict(self.seconds),
            "damages": {n: dict(d) for n, d in self.damages.items()},
        }

    def _summary(self) -> str:
        kinds = sorted({t for d in self.damages.values() for t in d})
        took = sum(self.seconds.values())
        return (
            f"{len(self.damages)} tensors x {len(kinds)} types ({', '.join(kinds)}), "
            f"calibration={self.calibration!r}" + (f", {took:.1f} s" if took else "")
        )

    def _rows(self) -> list[dict[str, Any]]:
        return [
            {"tensor": n, "type": t, "damage": v}
            for n, d in self.damages.items()
            for t, v in d.items()
        ]


class _HeadTrial:
    """Trials of the output head's weights: whole-model runs against the original's
    log-probabilities (from the original head input and weights, kept once)."""

    def __init__(self, runner: Runner) -> None:
        import torch

        self.torch = torch
        self.runner = runner
        assert runner.head is not None
        self.w0 = runner.head.weight.detach().clone().float()
        with torch.inference_mode():
            self.h0 = [runner._run_to_head(b).float() for b in runner.batches]

    def __call__(self) -> float:
        torch = self.torch
        F = torch.nn.functional
        head = self.runner.head
        bias = None if head.bias is None else head.bias.float()  # type: ignore[union-attr]
        w1 = head.weight.float()  # type: ignore[union-attr]
        total, count = 0.0, 0
        with torch.inference_mode():
            for b, inputs in enumerate(self.runner.batches):
                h1 = self.runner._run_to_head(inputs).float()
                h0 = self.h0[b].reshape(-1, h1.shape[-1])
                h1 = h1.reshape(-1, h1.shape[-1])
                for i in range(0, h1.shape[0], _CHUNK):
                    lp0 = torch.log_softmax(
                        F.linear(h0[i : i + _CHUNK], self.w0, bias).double(), -1
                    )
                    lp1 = torch.log_softmax(F.linear(h1[i : i + _CHUNK], w1, bias).double(), -1)
                    total += float((lp0.exp() * (lp0 - lp1)).sum())
                count += h1.shape[0]
        return total / count


def gguf_sensitivity(
    checkpoint: Checkpoint,
    options: Mapping[str, Mapping[str, Any]],
    calibration: ScanSamples,
    *,
    vectors: Mapping[str, np.ndarray] | None = None,
    batch: int = 4,
    progress: Progress = None,
    compute: str = "fp32",
    rounder: Callable[[np.ndarray, str, np.ndarray | None], np.ndarray] | None = None,
) -> GgufSensitivity:
    """Measure every tensor of ``options`` in each of its types, one tensor at a time.

    Args:
        checkpoint: an open GGUF checkpoint of a causal LM lowbit builds.
        options: ``{tensor: {type: ...}}`` (:func:`~lowbit.checkpoints.gguf.budget.budget_options`).
        calibration: token windows (keep them apart from the evaluation's text).
        vectors: ``{tensor: importance vector}`` for the types that use one.
        batch: windows per forward pass.
        progress: a bar over the trials (``True``, ``False``, ``None``: on a terminal or in
            Jupyter), or a callable ``progress(done, total)`` after each trial.
        compute: precision of the model's matrix products (``fp32``, ``bf16``, ``auto``).
        rounder: ``rounder(w, type, vector)``: the tensor stored as ``type`` and read back,
            instead of llama.cpp's :func:`roundtrip` (the MLX budget's grids,
            :mod:`lowbit.jobs.mlx_budget`).

    Raises:
        LowbitError: a model lowbit cannot build, no windows, a tensor that fills no parameter.
    """
    report, close = step_reporter(progress, "GGUF trials", "trial")
    try:
        return _gguf_sensitivity(
            checkpoint, options, calibration, vectors, batch, report, compute, rounder or roundtrip
        )
    finally:
        close()


def _gguf_sensitivity(
    checkpoint: Checkpoint,
    options: Mapping[str, Mapping[str, Any]],
    calibration: ScanSamples,
    vectors: Mapping[str, np.ndarray] | None,
    batch: int,
    progress: Callable[[int, int], None] | None,
    compute: str,
    rounder: Callable[[np.ndarray, str, np.ndarray | None], np.ndarray],
) -> GgufSensitivity:
    import torch

    if not calibration.windows:
        raise LowbitError("the GGUF budget's trials need token windows of a causal LM")
    compute = resolve_compute(compute)
    vectors = dict(vectors or {})
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    model = build_model(checkpoint, progress=False)
    runner = Runner(model, None, "causal", calibration, batch)
    weights = TensorWeights(model, checkpoint)
    seconds["build"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    with compute_context(compute):
        runner.reference()
    head_trial = None
    seconds["reference"] = time.perf_counter() - t0
    total = sum(len(v) for v in options.values())
    done = 0
    damages: dict[str, dict[str, float]] = {}
    t0 = time.perf_counter()
    for name, types in options.items():
        p = weights.param(name)
        saved = p.detach().clone()
        is_head = runner.head is not None and p is runner.head.weight
        if is_head and head_trial is None:
            with compute_context(compute):
                head_trial = _HeadTrial(runner)
        start = block_of(weights, runner.blocks, name)
        w = np.asarray(checkpoint.get(name), dtype=np.float32)
        damages[name] = {}
        try:
            for t in types:
                try:
                    w_hat = rounder(w, t, vectors.get(name))
                except LowbitError as exc:
                    raise LowbitError(f"tensor {name!r} as {t}: {exc}") from None
                weights.fill(p, name, w_hat)
                with compute_context(compute):
                    d = head_trial() if is_head else runner.trial(start)  # type: ignore[misc]
                damages[name][t] = max(0.0, float(d))
                done += 1
                if progress is not None:
                    progress(done, total)
        finally:
            with torch.no_grad():
                p.copy_(saved)
        checkpoint.close()  # unmap the tensor's pages
    seconds["trials"] = time.perf_counter() - t0
    return GgufSensitivity(damages, calibration.label, seconds=seconds)


def gguf_block_sensitivity(
    checkpoint: Checkpoint,
    options: Mapping[str, Mapping[str, Any]],
    calibration: ScanSamples,
    *,
    vectors: Mapping[str, np.ndarray] | None = None,
    batch: int = 4,
    progress: Progress = None,
    compute: str = "fp32",
    rounder: Callable[[np.ndarray, str, np.ndarray | None], np.ndarray] | None = None,
) -> GgufSensitivity:
    """:func:`gguf_sensitivity`'s damages measured block by block: each trial runs the
    tensor's block alone on that block's calibrated inputs, its output error weighted by the
    next-token Fisher at the last block (:mod:`lowbit.evaluation.block_sensitivity`: the
    measure, what it leaves out, its memory). Same arguments (``rounder`` included) and result.
    """
    vectors = dict(vectors or {})
    rnd = rounder or roundtrip
    report, close = step_reporter(progress, "GGUF block trials", "trial")
    try:
        got = block_damages(
            checkpoint,
            {n: list(types) for n, types in options.items()},
            lambda name, w, t: rnd(w, t, vectors.get(name)),
            calibration,
            batch=batch,
            progress=report,
            compute=compute,
        )
    finally:
        close()
    return GgufSensitivity(got.damages, calibration.label, metric=BLOCK_METRIC, seconds=got.seconds)
