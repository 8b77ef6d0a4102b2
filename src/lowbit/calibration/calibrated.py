"""Quantize and write a whole model with a calibrated method: what ``lowbit.quantize_model`` is.

>>> import lowbit                                                          # doctest: +SKIP
>>> plan = lowbit.PrecisionPlan.uniform("int4", group_size=128)
>>> lowbit.quantize_model("smollm2", plan, "smol-gptq", method=lowbit.GPTQ(damp=0.01),
...                       calibration=lowbit.Calibration(samples=32))
>>> lowbit.quantize_model("smollm2", plan, "smol-awq", method="awq")
>>> w8a8 = lowbit.PrecisionPlan.uniform("int8:ch", activations="int8")
>>> lowbit.quantize_model("smollm2", w8a8, "smol-sq", method=lowbit.SmoothQuant(alpha=0.8))

:func:`calibrated_weights` runs the method (``lowbit.calibration.gptq.gptq_weights``,
``lowbit.calibration.awq.awq_weights``) and builds the record ``lowbit quantize
--method gptq|awq`` / ``--smooth`` writes into the manifest; :func:`quantize_model` checks
everything that can be checked before minutes of calibration, runs it, and writes through
``lowbit.checkpoints.streaming.quantize_model`` (which, below this layer, writes tensors
already quantized and cannot calibrate).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lowbit.calibration._workers import distributed_calibration
from lowbit.calibration.awq import awq_weights
from lowbit.calibration.data import Calibration
from lowbit.calibration.gptq import gptq_weights
from lowbit.checkpoints import streaming as _writer
from lowbit.checkpoints.readers import Checkpoint, ReplacedCheckpoint
from lowbit.checkpoints.streaming import open_model, plan_model
from lowbit.errors import LowbitError
from lowbit.methods.awq import AWQ
from lowbit.methods.gptq import GPTQ
from lowbit.methods.smoothquant import GROUPED_ACTIVATIONS, SmoothQuant
from lowbit.models._compute import check_compute
from lowbit.plans.plan import AppliedPlan, PrecisionPlan
from lowbit.plans.rules import activation_format, calibrated_method

__all__ = ["METHODS", "CalibratedWeights", "calibrated_weights", "method_config", "quantize_model"]

#: The method names :func:`quantize_model` takes (or a GPTQ / AWQ / SmoothQuant object).
METHODS = ("rtn", "gptq", "awq", "smoothquant")

Method = GPTQ | AWQ | SmoothQuant


@dataclass(frozen=True)
class CalibratedWeights:
    """What a calibrated method made, ready to write.

    Attributes:
        checkpoint: what to write from: the source, or (AWQ, SmoothQuant) the source with the
            folded norms and biases in place of its own.
        weights: checkpoint name -> QuantizedTensor of every tensor the method quantized
            (the plan's others are rounded to nearest when written).
        record: what the manifest says about the method (``method``, its settings,
            ``calibration``, ``seconds`` per phase, per-layer errors ...), the same record
            ``lowbit quantize --method gptq|awq`` / ``--smooth`` writes.
    """

    checkpoint: Checkpoint
    weights: Mapping[str, Any]
    record: dict[str, Any]


def method_config(method: Any, applied: AppliedPlan) -> Method | None:
    """The calibrated method a ``method`` argument asks for, checked against the plan.

    Args:
        method: ``"rtn"`` / None (round to nearest, except tensors whose plan rule says
            ``method: gptq``), ``"gptq"``, ``"awq"``, ``"smoothquant"``, or a
            :class:`~lowbit.methods.gptq.GPTQ`, :class:`~lowbit.methods.awq.AWQ` or
            :class:`~lowbit.methods.smoothquant.SmoothQuant`.
        applied: the plan applied to the model (``plan_model``).

    Returns:
        The method's settings, or None for round to nearest everywhere.

    Raises:
        LowbitError: an unknown method, a SmoothQuant whose activation format is not the
            plan's one activation format (or a plan without one), plan rules naming both
            gptq and awq or another calibrated method than the one given, SmoothQuant with
            plan rules naming ``method: gptq`` or ``awq``.
    """
    methods = [t.method for t in applied.quantized]
    if method is None or isinstance(method, str):
        name = "rtn" if method is None else method.strip().lower()
        if name not in METHODS:
            raise LowbitError(
                f"unknown method {method!r}; allowed: {', '.join(METHODS)}, or a "
                "GPTQ, AWQ or SmoothQuant object"
            )
        if name == "rtn":  # only the tensors whose rules name gptq or awq are calibrated
            used = calibrated_method(methods, "rtn")
            return None if used == "rtn" else GPTQ() if used == "gptq" else AWQ()
        if name == "gptq":
            cfg: Method = GPTQ()
        elif name == "awq":
            cfg = AWQ()
        else:
            cfg = SmoothQuant(activations=_activations(applied, None))
    elif isinstance(method, GPTQ | AWQ | SmoothQuant):
        cfg = method
    else:
        raise LowbitError(
            f"method must be one of {', '.join(METHODS)}, a GPTQ, AWQ or SmoothQuant object, or "
            f"a record (Mapping) with weights=, got {type(method).__name__}"
        )
    if isinstance(cfg, SmoothQuant):
        _activations(applied, cfg)
        ruled = [(t.name, t.method) for t in applied.quantized if t.method in ("gptq", "awq")]
        if ruled:  # SmoothQuant rounds to nearest after its folds (a rule's rtn is what it does)
            raise LowbitError(
                f"the plan's rules name a method for {len(ruled)} tensors (e.g. "
                f"{ruled[0][0]}: {ruled[0][1]}); SmoothQuant rounds to nearest after its "
                "folds: drop those rules' method"
            )
    else:
        calibrated_method(methods, cfg.name, run=cfg.name)  # one calibrated method per run
    return cfg


def calibrated_weights(
    model: str | os.PathLike[str] | Checkpoint | None,
    plan: PrecisionPlan,
    method: Method,
    calibration: Calibration | str | os.PathLike[str] | None = None,
    *,
    default_method: str = "gptq",
    threads: int | None = None,
    progress: bool | None = None,
    compute: str = "fp32",
    workers: int = 1,
    ray: bool | str = False,
) -> CalibratedWeights:
    """Run a calibrated method on a model and build the record the manifest keeps of it.

    Args:
        model: a path, shipped model name or open checkpoint (``open_model``).
        plan: the :class:`~lowbit.plans.plan.PrecisionPlan`.
        method: a :class:`~lowbit.methods.gptq.GPTQ`, :class:`~lowbit.methods.awq.AWQ` or
            :class:`~lowbit.methods.smoothquant.SmoothQuant` (see :func:`method_config`).
        calibration: a :class:`~lowbit.calibration.data.Calibration`, a source
            (``"default"``, a ``.txt`` or ``.jsonl`` path) or None (the default data).
        default_method: how tensors whose plan rule names no method are quantized: the
            method's own name (``gptq``, ``awq``) or ``rtn`` (only the rules naming the method
            use it). SmoothQuant folds and rounds every planned tensor.
        threads: torch threads (default: the usable cores).
        progress: tqdm bars (``None``: only on a terminal; ``False``: never).
        compute: precision of the model's forward passes, ``fp32`` (default), ``bf16`` or
            ``auto`` (see :func:`lowbit.calibration.gptq.gptq_weights`).
        workers: GPTQ and AWQ: split the calibration samples over this many worker
            processes (1: this process alone, the default); the same codes as one process
            (``lowbit.calibration._workers``, docs/scale-out.md).
        ray: GPTQ and AWQ: run the workers as Ray actors (True: ``RAY_ADDRESS`` or a local
            instance; or a cluster address; ``workers`` 1: one per cluster CPU).

    Returns:
        A :class:`CalibratedWeights`.

    Raises:
        LowbitError: a bad calibration argument or data, a model lowbit cannot build, a plan
            that cannot apply, a method that is none of the three.
    """
    calib = _calibration(calibration)
    ckpt = open_model(model)
    spread = _spread(ckpt, method, workers, ray)
    if isinstance(method, GPTQ):
        kwargs = {"threads": threads, "progress": progress, "default_method": default_method,
                  "compute": compute}  # fmt: skip
        if spread is None:
            run = gptq_weights(ckpt, plan, calib, method, **kwargs)
        else:
            run = distributed_calibration("gptq", spread, (plan, calib, method), kwargs,
                                          workers=workers, ray=ray)  # fmt: skip
        done = run.weights  # kept on disk, read one at a time by the writer
        for n in [n for n, m in run.methods.items() if m != "gptq"]:
            del done[n]  # rounded to nearest again by the writer
        record = {
            **method.to_dict(),
            "sequential": run.sequential,  # what ran (blocks where no block was calibrated)
            "calibration": run.calibration,
            "seconds": run.seconds,
            "gptq_tensors": len(done),
            "layers": run.layers,  # per layer: output error of RTN and of GPTQ
        }
        return CalibratedWeights(ckpt, done, record)
    if not isinstance(method, AWQ | SmoothQuant):
        raise LowbitError(f"method must be GPTQ, AWQ or SmoothQuant, got {type(method).__name__}")
    kwargs = {"threads": threads, "progress": progress, "compute": compute, "default_method":
              "rtn" if default_method == "rtn" and isinstance(method, AWQ) else "awq"}  # fmt: skip
    if spread is None:
        awq = awq_weights(ckpt, plan, calib, method, **kwargs)
    else:
        awq = distributed_calibration("awq", spread, (plan, calib, method), kwargs,
                                      workers=workers, ray=ray)  # fmt: skip
    done = {n: qt for n, qt in awq.weights.items() if awq.methods[n] == method.name}
    record = {
        **method.to_dict(),
        "calibration": awq.calibration,
        "seconds": awq.seconds,
        "method_tensors": len(done),
        "folded_tensors": sorted(awq.replaced),
        "folds": awq.folds,
        "layers": awq.layers,  # per layer: output error of RTN and of the method
    }
    return CalibratedWeights(awq.checkpoint(ckpt), done, record)


def _spread(ckpt: Checkpoint, method: Any, workers: int, ray: bool | str) -> str | None:
    """The path the calibration workers open, or None to calibrate in this process.

    Raises:
        LowbitError: ``workers`` below 1; workers for SmoothQuant (its kept rows are drawn
            pass by pass from one generator); a checkpoint with no path to open.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise LowbitError(f"--workers must be a positive integer, got {workers!r}")
    if workers == 1 and ray is False:
        return None
    if isinstance(method, SmoothQuant):
        raise LowbitError("SmoothQuant calibrates in one process: drop --workers/--ray")
    path = getattr(ckpt, "path", None)
    if isinstance(ckpt, ReplacedCheckpoint) or path is None or not Path(path).exists():
        raise LowbitError(
            "calibration workers open the checkpoint from its path; this one has none"
        )
    return str(Path(path).resolve())


def quantize_model(
    model: str | os.PathLike[str] | Checkpoint | None,
    plan: PrecisionPlan,
    out: str | os.PathLike[str],
    *,
    method: str | Method | Mapping[str, Any] | None = "rtn",
    calibration: Calibration | str | os.PathLike[str] | None = None,
    out_format: str = "lowbit",
    gguf_rounding: str = "auto",
    overwrite: bool = False,
    copy_code: bool = False,
    max_shard_size: int | None = None,
    threads: int | None = None,
    progress: bool | None = None,
    weights: Mapping[str, Any] | None = None,
    compute: str = "fp32",
) -> dict[str, Any]:
    """Quantize a checkpoint with a precision plan, by rounding or a calibrated method, and
    write the result.

    The same checkpoint as ``lowbit quantize --method gptq|awq`` (or ``--smooth``) with the
    same settings: the same tensors, bit for bit, and the same manifest record (its
    ``seconds`` aside).

    Args:
        model: a path (``.safetensors``, a Hugging Face folder, ``.gguf``), a shipped model
            name (``smollm2``, ``minilm``), or an open checkpoint.
        plan: the :class:`~lowbit.plans.plan.PrecisionPlan`.
        out: the folder (``lowbit``, ``compressed-tensors``) or ``.gguf`` file to write.
        method: ``"rtn"`` (default; round to nearest, except tensors whose plan rule says
            ``method: gptq``, which get ``GPTQ()``), ``"gptq"``, ``"awq"``, ``"smoothquant"``
            (its activation format: the plan's), a :class:`~lowbit.methods.gptq.GPTQ`,
            :class:`~lowbit.methods.awq.AWQ` or :class:`~lowbit.methods.smoothquant.SmoothQuant`
            (its ``activations`` must be the plan's), or, with ``weights``, a record (Mapping)
            of how ``weights`` were made, written as it is. With ``"rtn"``, tensors whose plan
            rule says ``method: gptq`` or ``method: awq`` get ``GPTQ()`` or ``AWQ()``. AWQ and
            SmoothQuant write from the folded model (its norms and biases replace the source's
            in every output format); SmoothQuant does not write GGUF.
        calibration: for a calibrated method: a
            :class:`~lowbit.calibration.data.Calibration`, a source (``"default"``, a
            ``.txt`` or ``.jsonl`` path) or None (default: 128 x 512 tokens of the default
            text from token 32,768 for causal LMs, 256 texts for encoders).
        out_format: ``lowbit`` (default), ``compressed-tensors`` or ``gguf``.
        gguf_rounding: see ``lowbit.checkpoints.streaming.plan_model``.
        overwrite: replace an existing output that lowbit wrote.
        copy_code: also copy the source folder's ``.py`` files.
        max_shard_size: bytes per safetensors shard.
        threads: torch threads of the calibrated method (default: the usable cores).
        progress: tqdm bars (``None``: only on a terminal; ``False``: never).
        weights: tensors already quantized as the plan says (name -> QuantizedTensor), written
            as they are, with a record ``method`` or round to nearest; not with a calibrated
            method (it makes its own).
        compute: precision of a calibrated method's forward passes: ``fp32`` (default),
            ``bf16`` or ``auto`` (bf16 where the CPU's bfloat16 units are timed
            faster; see ``lowbit.models._compute``). Hessians, searches and rounding stay float32.

    Returns:
        The summary of ``lowbit.checkpoints.streaming.quantize_model`` (``out``,
        ``out_format``, ``source``, ``source_format``, ``totals``, ``bytes``, ``seconds``,
        ``copied_files``, ``left_out``) and ``method``: the record written to the manifest
        (None when everything was rounded to nearest without one).

    Raises:
        LowbitError: an unknown method or one of the wrong type; calibration given to round
            to nearest or to a record; ``weights`` given to a calibrated method; SmoothQuant to
            GGUF, without exactly one activation format in the plan, with another than the
            plan's, or with rules naming ``method: gptq`` or ``awq``; rules naming both gptq and
            awq, or another calibrated method than the one given; an existing output without
            ``overwrite`` (all these before any calibration); then anything
            ``lowbit.checkpoints.streaming.quantize_model`` or the method refuses (an
            unreadable source, an unquantizable tensor, a scheme the output format lacks, an
            output that is or lies inside the source, calibration data missing or too short,
            a model lowbit cannot build).

    Warns:
        UserWarning: as ``lowbit.checkpoints.streaming.quantize_model``.
    """
    check_compute(compute)
    if isinstance(method, Mapping) or (method is None and weights is not None):
        if calibration is not None:
            raise LowbitError(
                "calibration is for a calibrated method (gptq, awq, smoothquant); a method "
                "record with weights= writes tensors already quantized"
            )
        record = None if method is None else dict(method)
        summary = _writer.quantize_model(
            model, plan, out, out_format=out_format, gguf_rounding=gguf_rounding,
            overwrite=overwrite, copy_code=copy_code, max_shard_size=max_shard_size,
            progress=progress, weights=weights, method=record,
        )  # fmt: skip
        return {**summary, "method": record}
    calib = None if calibration is None else _calibration(calibration)
    ckpt = open_model(model)
    try:
        applied = plan_model(ckpt, plan, out_format=out_format, gguf_rounding=gguf_rounding)
        cfg = method_config(method, applied)
        if cfg is None and calib is not None:
            raise LowbitError(
                "calibration is for a calibrated method: method 'rtn' rounds to nearest "
                "(use method='gptq', 'awq' or 'smoothquant', or drop calibration)"
            )
        if cfg is not None and weights is not None:
            raise LowbitError(
                f"weights= are tensors already quantized; {cfg.name} makes its own: pass "
                "either a method to run or weights= with a record (Mapping) of how they were made"
            )
        if isinstance(cfg, SmoothQuant) and out_format == "gguf":
            raise LowbitError(
                "SmoothQuant prepares W8A8 models (per-token activations), which GGUF cannot "
                "declare: write out_format='compressed-tensors' (vLLM) or 'lowbit'"
            )
        if not str(out):
            raise LowbitError("the output path is empty")
        if cfg is not None and Path(out).exists() and not overwrite:
            raise LowbitError(f"{out} exists; pass overwrite=True to replace it")
        source: Any = ckpt
        done: dict[str, Any] | None = None if weights is None else dict(weights)
        record = None
        if cfg is not None:
            rtn = method is None or (isinstance(method, str) and method.strip().lower() == "rtn")
            default = "rtn" if rtn else cfg.name  # rtn: only the rules naming a method use it
            run = calibrated_weights(
                ckpt, plan, cfg, calib, default_method=default, threads=threads,
                progress=progress, compute=compute,
            )  # fmt: skip
            source, done, record = run.checkpoint, run.weights, run.record
    except BaseException:
        if not isinstance(model, Checkpoint):
            ckpt.close()
        raise
    summary = _writer.quantize_model(
        source, plan, out, out_format=out_format, gguf_rounding=gguf_rounding,
        overwrite=overwrite, copy_code=copy_code, max_shard_size=max_shard_size,
        progress=progress, weights=done, method=record,
    )  # fmt: skip
    return {**summary, "method": record}


def _activations(applied: AppliedPlan, cfg: SmoothQuant | None) -> str:
    """The plan's one activation format, which SmoothQuant prepares the weights for."""
    acts = sorted({t.activations for t in applied.quantized if t.activations})
    if len(acts) != 1:
        raise LowbitError(
            "SmoothQuant prepares activations for W8A8: the plan must give its quantized "
            "tensors one activation format (e.g. PrecisionPlan.uniform('int8:ch', "
            f"activations='int8')), {'not several: ' + ', '.join(acts) if acts else 'it has none'}"
        )
    if (
        cfg is not None
        and cfg.activations != acts[0]
        and (
            cfg.activations in GROUPED_ACTIVATIONS or activation_format(cfg.activations) != acts[0]
        )
    ):
        raise LowbitError(
            f"SmoothQuant(activations={cfg.activations!r}) but the plan's activations are "
            f"{acts[0]!r}: give SmoothQuant the plan's format"
        )
    return acts[0]


def _calibration(calibration: Any) -> Calibration:
    if calibration is None:
        return Calibration()
    if isinstance(calibration, Calibration):
        return calibration
    if isinstance(calibration, str | os.PathLike):
        return Calibration(source=os.fspath(calibration))
    raise LowbitError(
        "calibration must be a Calibration, a source ('default', a .txt or .jsonl path) or "
        f"None, got {type(calibration).__name__}"
    )
