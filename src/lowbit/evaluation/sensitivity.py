"""How much each tensor costs the model when it alone is quantized: the input to mixed precision.

For every tensor a uniform plan would quantize and every candidate scheme, :func:`sensitivity`
measures the damage of quantizing that tensor alone, everything else kept as in the source:

- ``exact``: for causal LMs the mean KL divergence KL(original || trial) of the next-token
  distributions over the calibration tokens; for encoders ``1 - mean cosine`` of the
  mean-pooled sentence embeddings against the original's.
- ``proxy``: the expected squared error of the layer's output if its inputs were uncorrelated,
  ``sum_j E[x_j^2] * sum_i (W_ij - Q(W)_ij)^2``: the weight error weighted by the diagonal of
  ``X^T X / n`` (collected once, with hooks on the linear layers). Cheap: one forward pass.
  With ``proxy="fisher"`` the proxy is instead
  ``sum_ij E[g_i^2] * E[x_j^2] * (W_ij - Q(W)_ij)^2``, ``g`` the gradient of the loss with
  respect to the layer's output: the second-order (Optimal Brain Surgeon style) estimate of the
  damage, ``1/2 dW^T F dW``, with the Fisher information ``F`` restricted to its diagonal and
  each weight's entry ``E[g_i^2 x_j^2]`` factored as ``E[g_i^2] E[x_j^2]``, the weighting that
  HAWQ and SqueezeLLM use to find sensitive weights. One forward and backward pass; the loss
  and why: :meth:`lowbit.evaluation._sensitivity_runner.Runner.output_moments`. Measured on
  SmolLM2 its rank correlation with the exact damage is far higher than the plain proxy's
  (docs/quantize-models.md, Mixed precision).
- ``block``: each trial runs the tensor's block alone on that block's calibrated inputs; the
  block's output error, weighted by the next-token Fisher at the last block, estimates the
  mean KL (:mod:`lowbit.evaluation.block_sensitivity`: far fewer block forwards than
  ``exact``, causal LMs only). The proxy is reported beside it.

The exact scan reuses work: the hidden states entering block ``b`` are the same for every
trial inside blocks ``>= b``, so one forward pass of the original caches them, and a trial
runs only blocks ``b..end`` and the head; the KL needs no stored log-probabilities (how, and
the memory it takes: :mod:`lowbit.evaluation._sensitivity_runner`).

The damage of each option and its exact storage cost (codes, scales, zero points: the
:class:`~lowbit.quant.quantized_tensor.QuantizedTensor` that ``lowbit quantize`` would write) feed the
bits-budget solver (:mod:`lowbit.plans.budget`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from lowbit._parallel import threads
from lowbit._progress import Progress, step_reporter
from lowbit._workers_cap import check_workers
from lowbit.checkpoints.readers import Checkpoint
from lowbit.checkpoints.streaming import plan_model
from lowbit.errors import LowbitError
from lowbit.evaluation._sensitivity_runner import Runner, TensorWeights, block_of
from lowbit.evaluation._sensitivity_workers import distributed_scan
from lowbit.evaluation.block_sensitivity import BLOCK_METRIC, block_damages
from lowbit.evaluation.scan_samples import ScanSamples
from lowbit.evaluation.sensitivity_result import (
    _PROXIES,
    SensitivityEntry,
    SensitivityResult,
    _check_proxy,
    spearman,
)
from lowbit.models._compute import compute_context, resolve_compute
from lowbit.models.build import build_model
from lowbit.plans.plan import PrecisionPlan
from lowbit.quant.tensor import quantize

__all__ = [
    "SensitivityEntry",
    "SensitivityResult",
    "sensitivity",
    "spearman",
]


# ---------------------------------------------------------------------------------------
# The scan
# ---------------------------------------------------------------------------------------

# Tensors up to this many elements have the proxy-only trials of their schemes run on
# separate threads (with the compiled kernels their quantization is one chunk of
# lowbit.quant._engine, so one thread); larger ones are quantized one scheme at a time, each
# spread over the threads by quantize itself, which also bounds the memory of a scan of a
# large model to one trial's arrays.
_PARALLEL_NUMEL = 1 << 20

_METRICS = {
    "causal": "mean KL(original || trial) of next-token distributions, nats",
    "encoder": "1 - mean cosine of sentence embeddings",
}


def _plans(
    checkpoint: Checkpoint, schemes: Sequence[str], select: Sequence[str] = ()
) -> tuple[list[Any], list[str]]:
    """The uniform plan of each scheme applied to the checkpoint, and the tensors they quantize
    (those matching a glob of ``select``, when given).

    Needs no model: the driver of a distributed scan calls it to number the trials.
    """
    if not schemes:
        raise LowbitError("give at least one candidate scheme")
    plans = [plan_model(checkpoint, PrecisionPlan.uniform(s)) for s in schemes]
    if select:
        plans = [
            dataclasses.replace(
                a,
                tensors=tuple(
                    t for t in a.tensors
                    if t.action != "quantize" or any(fnmatch.fnmatchcase(t.name, g) for g in select)
                ),
            )
            for a in plans
        ]  # fmt: skip
    names = [t.name for t in plans[0].quantized]
    if not names:
        what = f" matching {', '.join(select)}" if select else ""
        raise LowbitError(f"{checkpoint.path}: no tensor to quantize{what}")
    for s, applied in zip(schemes[1:], plans[1:], strict=True):
        if [t.name for t in applied.quantized] != names:
            raise LowbitError(f"scheme {s!r} quantizes other tensors than {schemes[0]!r}")
    return plans, names


def _exact_indices(schemes: Sequence[str], exact: Sequence[str]) -> set[int]:
    """Indices of the schemes whose trials run the model (all when ``exact`` is empty)."""
    if not exact:
        return set(range(len(schemes)))
    unknown = [e for e in exact if e not in schemes]
    if unknown:
        raise LowbitError(f"exact_schemes {unknown} are not among the schemes {list(schemes)}")
    return {i for i, s in enumerate(schemes) if s in exact}


class _Scan:
    """What one process needs to run trials: the model, its cached block inputs, the moments.

    Every process of a distributed scan builds its own (from a path it can read) and runs the
    trials it is given; a trial's numbers depend only on the model, the calibration data and
    the trial, so any split of the trials gives the numbers of one process running them all.
    """

    def __init__(
        self,
        checkpoint: Checkpoint,
        schemes: Sequence[str],
        calibration: ScanSamples,
        tokenizer: Any,
        measure: str,
        batch: int,
        select: Sequence[str] = (),
        exact_schemes: Sequence[str] = (),
        proxy: str = "input",
        compute: str = "fp32",
    ) -> None:
        if measure not in ("exact", "proxy"):
            raise LowbitError(f"measure must be 'exact' or 'proxy', got {measure!r}")
        self.proxy = _check_proxy(proxy)
        self.seconds: dict[str, float] = {}
        self.checkpoint = checkpoint
        self.measure = measure
        self.compute = resolve_compute(compute)
        t0 = time.perf_counter()
        self.plans, self.names = _plans(checkpoint, schemes, select)
        self.exact = _exact_indices(schemes, exact_schemes) if measure == "exact" else set()
        model = build_model(checkpoint, progress=False)
        self.kind = (
            "causal"
            if hasattr(model, "lm_head") or "CausalLM" in type(model).__name__
            else "encoder"
        )
        self.runner = Runner(model, tokenizer, self.kind, calibration, batch)
        self.weights = TensorWeights(model, checkpoint)
        self.seconds["build"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        modules = [self.weights.module(n) for n in self.names]
        with compute_context(self.compute):
            self.moments = self.runner.input_moments(modules)
        self.seconds["proxy_pass"] = time.perf_counter() - t0
        self.grads: dict[str, np.ndarray] = {}
        if self.proxy == "fisher":
            t0 = time.perf_counter()
            with compute_context(self.compute):
                self.grads = self.runner.output_moments(modules)
            self.seconds["gradient_pass"] = time.perf_counter() - t0
        if measure == "exact":
            t0 = time.perf_counter()
            with compute_context(self.compute):
                self.runner.reference()
            self.seconds["reference"] = time.perf_counter() - t0
        self._source: tuple[str, Any] = ("", None)  # the last tensor read, in source layout
        self.start_of = {n: block_of(self.weights, self.runner.blocks, n) for n in self.names}

    @property
    def count(self) -> int:
        """Number of trials: tensors x schemes (numbered scheme-major, in model order)."""
        return len(self.names) * len(self.plans)

    def run(self, trial: int, cached: bool = True) -> SensitivityEntry:
        """One trial: quantize tensor ``trial % tensors`` with scheme ``trial // tensors``."""
        scheme = trial // len(self.names)
        t = self.plans[scheme].quantized[trial % len(self.names)]
        qt, w_hat, proxy = self._quantized(t, self._read(t.name))
        damage = self._damage(t, w_hat, cached) if scheme in self.exact else None
        return _entry(t, qt, proxy, damage)

    def run_all(
        self, cached: bool = True, progress: Callable[[int, int], None] | None = None
    ) -> list[SensitivityEntry]:
        """Every trial, in scan order: what :meth:`run` gives for each, computed tensor by
        tensor (each read once for all its schemes).

        The trials that only compute the proxy (quantize, dequantize, weighted error) of a
        tensor small enough that its quantization is one chunk run on ``lowbit._parallel``'s
        threads, while this thread reads the next tensor and runs the model for the exact
        trials; a large tensor's quantization is spread over those threads by
        :func:`~lowbit.quant.tensor.quantize` itself. Threads change no number: each trial
        computes what it computes alone.
        """
        n = len(self.names)
        found: dict[int, SensitivityEntry] = {}
        workers = threads()
        pool = (
            ThreadPoolExecutor(workers, thread_name_prefix="lowbit-scan") if workers > 1 else None
        )

        def finish(k: int, arr: Any, jobs: dict[int, Future[Any]]) -> None:
            for s, applied in enumerate(self.plans):
                t = applied.quantized[k]
                if s in jobs:
                    qt, _, proxy = jobs[s].result()
                    found[s * n + k] = _entry(t, qt, proxy, None)
                else:  # exact trials (their quantized weight goes into the model) and those
                    # of large tensors, in this thread
                    exact = s in self.exact
                    qt, w_hat, proxy = self._quantized(t, arr, keep=exact)
                    damage = self._damage(t, w_hat, cached) if exact else None
                    found[s * n + k] = _entry(t, qt, proxy, damage)
                    del w_hat
                if progress is not None:
                    progress(len(found), self.count)

        pending: tuple[int, Any, dict[int, Future[Any]]] | None = None
        try:
            for k, name in enumerate(self.names):
                arr = self._read(name)
                jobs: dict[int, Future[Any]] = {}
                if pool is not None and arr.size <= _PARALLEL_NUMEL:
                    jobs = {
                        s: pool.submit(self._quantized, applied.quantized[k], arr, keep=False)
                        for s, applied in enumerate(self.plans)
                        if s not in self.exact
                    }
                if pending is not None:
                    finish(*pending)
                    pending = None
                if jobs:  # finished after the next tensor is read and its jobs started
                    pending = (k, arr, jobs)
                else:
                    finish(k, arr, jobs)
            if pending is not None:
                finish(*pending)
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        return [found[i] for i in range(self.count)]

    def _read(self, name: str) -> Any:
        """A tensor in source layout, read once for all schemes of it in a row."""
        if self._source[0] != name:
            self._source = ("", None)
            self.checkpoint.close()  # unmap the previous tensor's pages
            self._source = (name, self.checkpoint.get(name))
        return self._source[1]

    def _quantized(self, t: Any, arr: Any, keep: bool = True) -> tuple[Any, Any, float]:
        """``(quantized tensor, its dequantized float32 values or None without keep, proxy)``
        of a plan's tensor ``t`` read as ``arr``."""
        try:
            qt = quantize(arr, t.scheme)
        except LowbitError as exc:
            raise LowbitError(f"tensor {t.name!r}: {exc}") from None
        w_hat = qt.dequantize(np.float32)
        w = np.asarray(arr, dtype=np.float32)
        module = self.weights.module(t.name)
        # (w - w_hat)^2 in float64, the operations of (w.astype(float64) - w_hat) ** 2 in
        # place (one temporary instead of two; a mixed-dtype ufunc would be slower)
        err2 = w.astype(np.float64)
        err2 -= w_hat
        np.square(err2, out=err2)
        proxy = _proxy_score(
            err2,
            self.moments.get(module),
            self.grads.get(module) if self.proxy == "fisher" else None,
            lambda a: self.weights.model_layout(t.name, a),
            self.proxy,
        )
        return qt, (w_hat if keep else None), proxy

    def _damage(self, t: Any, w_hat: np.ndarray, cached: bool) -> float:
        """The exact damage: the model with ``t``'s parameter set to ``w_hat``, run from the
        block holding it (``cached``) or whole; the parameter is restored after."""
        import torch

        p = self.weights.param(t.name)
        saved = p.detach().clone()
        self.weights.fill(p, t.name, w_hat)
        try:
            with compute_context(self.compute):
                return self.runner.trial(self.start_of[t.name] if cached else -1)
        finally:
            with torch.no_grad():
                p.copy_(saved)


def _entry(t: Any, qt: Any, proxy: float, damage: float | None) -> SensitivityEntry:
    return SensitivityEntry(
        tensor=t.name,
        scheme=t.scheme.label,
        numel=qt.numel,
        bits=qt.nbytes * 8,
        proxy=proxy,
        damage=damage,
    )


def _proxy_score(
    err2: np.ndarray,
    x2: np.ndarray | None,
    g2: np.ndarray | None,
    layout: Callable[[np.ndarray], np.ndarray],
    proxy: str,
) -> float:
    """The proxy of one trial from its squared weight error ``err2`` (checkpoint layout, output
    rows x input columns), the input moments ``x2`` (E[x_j^2]) and, for ``fisher``, the
    output-gradient moments ``g2`` (E[g_i^2], in the model's row order: ``layout`` maps the
    checkpoint's rows to it). NaN when the moments do not fit the tensor (not a linear's
    weight)."""
    if x2 is None or err2.ndim != 2 or x2.shape != err2.shape[1:]:
        return math.nan
    if proxy == "input":
        return float(err2.sum(0) @ x2)
    if g2 is None:
        return math.nan
    rows = layout(err2)
    if g2.shape != rows.shape[:1]:
        return math.nan
    return float(g2 @ rows @ x2)


def sensitivity(
    checkpoint: Checkpoint,
    schemes: Sequence[str],
    calibration: ScanSamples,
    *,
    tokenizer: Any = None,
    measure: str = "exact",
    cached: bool = True,
    batch: int = 4,
    progress: Progress = None,
    workers: int = 1,
    ray: bool | str = False,
    tensors: Sequence[str] = (),
    exact_schemes: Sequence[str] = (),
    proxy: str = "input",
    compute: str = "fp32",
) -> SensitivityResult:
    """Measure every quantizable tensor under every candidate scheme, one tensor at a time.

    Args:
        checkpoint: an open checkpoint (``lowbit.open_checkpoint``).
        schemes: candidate scheme strings (``int4:g128``, ``nf4``, ``int8:ch`` ...).
        calibration: token windows (causal LMs) or sentences (encoders); keep them disjoint
            from the data the result will be evaluated on
            (:func:`lowbit.evaluation.scan_samples.scan_samples` does).
        tokenizer: the model's tokenizer (encoders).
        measure: ``exact`` (the measured damage, and the proxy beside it), ``block`` (the
            block-local estimate of it, and the proxy beside it; causal LMs, one process) or
            ``proxy`` only.
        cached: reuse the cached block inputs (``False`` runs the whole model per trial: for
            checking the cache, same numbers).
        batch: windows or sentences per forward pass.
        progress: a bar over the trials: ``True`` shows it, ``False`` never, ``None`` on a
            terminal or in Jupyter (:mod:`lowbit._progress`); or a callable, called as
            ``progress(done, total)`` after each trial (each chunk of trials when they run on
            workers).
        workers: processes that run trials (1: this process, where the trials that compute
            only the proxy run on ``lowbit._parallel``'s threads). Each opens the checkpoint from
            its path, builds the model and its cache, and runs a share of the trials
            (:mod:`lowbit.evaluation._sensitivity_workers`); the result is the same.
        ray: run the trials on a Ray cluster: ``True`` connects as ``ray.init()`` does (a
            running cluster named by ``RAY_ADDRESS``, else a local instance), a string is the
            cluster's address. ``workers`` is then the number of Ray actors (1: one per CPU of
            the cluster). The checkpoint's path must be readable on every node.
        tensors: globs; only the tensors matching one are tried (default: all).
        exact_schemes: with ``measure="exact"``, the schemes (strings of ``schemes``) whose
            trials run the model; the others get the proxy only, and the budget scores them
            by the proxy times the tensor's measured damage-to-proxy ratio
            (:meth:`SensitivityResult.score`). Default: every scheme.
        proxy: the proxy given with every trial (and the only number with ``measure="proxy"``):
            ``input`` (``sum_j E[x_j^2] ||W_j - Q(W)_j||^2``, one forward pass) or ``fisher``
            (``sum_ij E[g_i^2] E[x_j^2] (W - Q(W))_ij^2``, one more forward and backward pass;
            causal LMs only).
        compute: precision of the model's matrix products in the moment passes and the
            trials: ``fp32`` (default), ``bf16`` or ``auto`` (``lowbit.models._compute``);
            the moments are summed in float32/float64 and the quantization is numpy.

    Returns:
        A :class:`SensitivityResult`.

    Raises:
        LowbitError: an unknown scheme, measure or proxy, a model lowbit cannot build, no
            tensors, ``workers < 1``, the fisher proxy of an encoder.
        ImportError: ``ray`` given without Ray installed (``pip install 'lowbit[ray]'``).
    """
    if measure not in ("exact", "proxy", "block"):
        raise LowbitError(f"measure must be 'exact', 'block' or 'proxy', got {measure!r}")
    report, close = step_reporter(progress, "sensitivity", "trial")
    try:
        return _sensitivity(
            checkpoint, schemes, calibration, tokenizer, measure, cached, batch, report,
            workers, ray, tensors, exact_schemes, proxy, compute,
        )  # fmt: skip
    finally:
        close()


def _sensitivity(
    checkpoint: Checkpoint,
    schemes: Sequence[str],
    calibration: ScanSamples,
    tokenizer: Any,
    measure: str,
    cached: bool,
    batch: int,
    progress: Callable[[int, int], None] | None,
    workers: int,
    ray: bool | str,
    tensors: Sequence[str],
    exact_schemes: Sequence[str],
    proxy: str,
    compute: str,
) -> SensitivityResult:
    check_workers(workers)
    _check_proxy(proxy)
    _exact_indices(schemes, exact_schemes)
    compute = resolve_compute(compute)  # once, here: every worker runs what this machine chose
    if measure == "block":
        if ray is not False or workers > 1 or exact_schemes:
            raise LowbitError("the block measure runs in one process, every scheme measured "
                              "(no workers, ray or exact_schemes)")  # fmt: skip
        return _block_scan(checkpoint, schemes, calibration, tokenizer, cached, batch, progress,
                           tensors, proxy, compute)  # fmt: skip
    if ray is not False or workers > 1:
        labels = [a.quantized[0].scheme.label for a in _plans(checkpoint, schemes, tensors)[0]]
        kind, entries, seconds = distributed_scan(
            checkpoint.path,
            tuple(schemes),
            calibration,
            tokenizer=tokenizer,
            measure=measure,
            cached=cached,
            batch=batch,
            progress=progress,
            workers=workers,
            ray=ray,
            select=tuple(tensors),
            exact_schemes=tuple(exact_schemes),
            proxy=proxy,
            compute=compute,
            scan_type=_Scan,
            plans=_plans,
        )
    else:
        scan = _Scan(
            checkpoint,
            schemes,
            calibration,
            tokenizer,
            measure,
            batch,
            tensors,
            exact_schemes,
            proxy,
            compute,
        )
        labels = [a.quantized[0].scheme.label for a in scan.plans]
        t0 = time.perf_counter()
        entries = scan.run_all(cached, progress)
        seconds = {**scan.seconds, "trials": time.perf_counter() - t0}
        kind = scan.kind
    return SensitivityResult(
        model=str(checkpoint.path),
        kind=kind,
        measure=measure,
        metric=_METRICS[kind] if measure == "exact" else f"proxy: {_PROXIES[proxy]}",
        calibration=calibration.label,
        schemes=tuple(labels),
        entries=tuple(entries),
        seconds=seconds,
        proxy=proxy,
    )


def _block_scan(
    checkpoint: Checkpoint,
    schemes: Sequence[str],
    calibration: ScanSamples,
    tokenizer: Any,
    cached: bool,
    batch: int,
    progress: Callable[[int, int], None] | None,
    tensors: Sequence[str],
    proxy: str,
    compute: str,
) -> SensitivityResult:
    """``measure="block"``: the proxy scan's entries (bits, proxy), each with its block-local
    damage (:func:`lowbit.evaluation.block_sensitivity.block_damages`)."""
    scan = _Scan(checkpoint, schemes, calibration, tokenizer, "proxy", batch, tensors, (), proxy,
                 compute)  # fmt: skip
    if scan.kind != "causal":
        raise LowbitError("the block measure needs a causal LM (its weights are next-token)")
    t0 = time.perf_counter()
    entries = scan.run_all(cached)
    seconds = {**scan.seconds, "proxy_trials": time.perf_counter() - t0}
    labels = [a.quantized[0].scheme.label for a in scan.plans]
    by_label = {
        (t.name, t.scheme.label): t.scheme for applied in scan.plans for t in applied.quantized
    }
    del scan

    def roundtrip(name: str, w: np.ndarray, label: str) -> np.ndarray:
        return quantize(w, by_label[(name, label)]).dequantize(np.float32)

    trials = {n: labels for n in dict.fromkeys(e.tensor for e in entries)}
    got = block_damages(checkpoint, trials, roundtrip, calibration, batch=batch,
                        progress=progress, compute=compute)  # fmt: skip
    entries = [dataclasses.replace(e, damage=got.damages[e.tensor][e.scheme]) for e in entries]
    return SensitivityResult(
        model=str(checkpoint.path),
        kind="causal",
        measure="block",
        metric=BLOCK_METRIC,
        calibration=calibration.label,
        schemes=tuple(labels),
        entries=tuple(entries),
        seconds={**seconds, **got.seconds},
        proxy=proxy,
    )
