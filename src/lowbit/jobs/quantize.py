"""``lowbit.quantize_model``: quantize a whole model and write it, any source to any output, in
one call: what ``lowbit quantize`` does, with the same bytes.

>>> import lowbit                                                          # doctest: +SKIP
>>> lowbit.quantize_model("smollm2", "int4:g128", "smol-int4")
>>> lowbit.quantize_model("smollm2", "nvfp4", "smol-nvfp4", method="gptq",
...                       out_format="compressed-tensors")
>>> lowbit.quantize_model("smollm2", "q4_k_m", "smol.Q4_K_M.gguf", out_format="gguf",
...                       imatrix="imatrix.gguf")
>>> lowbit.quantize_model("smollm2", None, "smol.gguf", out_format="gguf", size=90_000_000)
>>> lowbit.quantize_model("smollm2", None, "smol-mlx", out_format="mlx", budget=4.5)

The routes: a llama.cpp mix name with ``out_format="gguf"`` goes to
:func:`lowbit.jobs.gguf.gguf_mix`; ``size``/``budget`` with GGUF output to
:func:`lowbit.jobs.gguf.gguf_budget`; MLX output to :func:`lowbit.jobs.mlx_budget.mlx_job`
(a budget to :func:`lowbit.jobs.mlx_budget.mlx_budget`); everything else through a precision
plan (a scheme string, a :class:`~lowbit.plans.plan.PrecisionPlan`, or one solved from a
sensitivity scan for ``budget``/``size``), the method (round to nearest, GPTQ, AWQ, SmoothQuant with or without GPTQ,
the Hadamard rotations and folds), NVFP4 input scales, and the writer
(:func:`lowbit.checkpoints.streaming.quantize_model`).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lowbit.calibration import calibrated
from lowbit.calibration._resume import Resume, resume_folder
from lowbit.calibration.calibrated import calibrated_weights
from lowbit.calibration.data import Calibration
from lowbit.calibration.input_scales import nvfp4_input_scales
from lowbit.calibration.smooth_gptq import smoothquant_gptq_weights
from lowbit.checkpoints.compressed_tensors.pipeline import ct_weights
from lowbit.checkpoints.streaming import (
    OUT_FORMATS,
    check_unrotated,
    output_nbytes,
    plan_model,
    rotated_tensors,
)
from lowbit.checkpoints.streaming import quantize_model as write_plan
from lowbit.errors import LowbitError
from lowbit.ggml import mixes
from lowbit.jobs import rotation
from lowbit.jobs.gguf import gguf_budget, gguf_mix
from lowbit.jobs.mlx_budget import mlx_job
from lowbit.jobs.results import QuantizeResult
from lowbit.jobs.sources import open_source
from lowbit.jobs.stopwatch import Stopwatch
from lowbit.methods.awq import AWQ
from lowbit.methods.gptq import GPTQ
from lowbit.methods.mr_gptq import MRGPTQ
from lowbit.methods.smoothquant import SmoothQuant, parse_alpha
from lowbit.plans.plan import PrecisionPlan
from lowbit.plans.rules import activation_format, calibrated_method

__all__ = ["METHODS", "is_gguf_mix", "quantize_model", "quantize_plan"]

#: The method names :func:`quantize_model` takes.
METHODS = (
    "rtn", "gptq", "awq", "smoothquant", "smoothquant+gptq",
    *rotation.ROTATING, *rotation.FOLDING,
)  # fmt: skip

Method = str | GPTQ | AWQ | SmoothQuant


def is_gguf_mix(to: object, out_format: str) -> bool:
    """Whether ``to`` names one of llama-quantize's mixes written as GGUF (``q4_k_m``,
    ``iq4_xs`` ...; ``q4_0``/``q8_0`` alone stay lowbit's own schemes, written as llama.cpp
    rounds them)."""
    if out_format != "gguf" or not isinstance(to, str):
        return False
    key = to.strip().upper()
    if key not in mixes.MIXES and key not in ("Q3_K", "Q4_K", "Q5_K"):
        return False
    return mixes.mix(key).default not in ("F32", "F16", "BF16") and key not in ("Q4_0", "Q8_0")


def _plan_of(to: Any, activations: str | None, pad: bool, opts: dict[str, Any]) -> Any:
    if isinstance(to, PrecisionPlan):
        if any(v is not None for v in opts.values()):
            raise LowbitError("group/scale_method/asym/scale_format modify a scheme string")
        return to if activations is None else to.with_default(
            to.default, activation_format(activations)
        )  # fmt: skip
    if isinstance(to, str):
        return PrecisionPlan.uniform(to, pad=pad, activations=activations, **opts)
    raise LowbitError(
        f"to={to!r}: give a scheme string ('int4:g128', 'nvfp4', 'q4_0'), a llama.cpp mix "
        "with out_format='gguf' ('q4_k_m'), or a PrecisionPlan"
    )


def _method_parts(method: Method) -> tuple[str, Any]:
    """``method`` as its name and its settings object (None: the defaults)."""
    if method is None:
        return "rtn", None
    if isinstance(method, MRGPTQ):
        return "hadamard+gptq", method
    if isinstance(method, GPTQ):
        return "gptq", method
    if isinstance(method, AWQ):
        return "awq", method
    if isinstance(method, SmoothQuant):
        return "smoothquant", method
    if isinstance(method, str) and method.strip().lower() in METHODS:
        return method.strip().lower(), None
    if isinstance(method, str):
        raise LowbitError(f"unknown method {method!r}; allowed: {', '.join(METHODS)}, or a "
                          "GPTQ, AWQ or SmoothQuant object")  # fmt: skip
    raise LowbitError(
        f"method must be one of {', '.join(METHODS)}, a GPTQ, AWQ or SmoothQuant object, or a "
        f"record (Mapping) with weights=, got {type(method).__name__}"
    )


def quantize_model(
    model: Any,
    to: str | PrecisionPlan | None = None,
    out: str | os.PathLike[str] | None = None,
    *,
    method: Method | Mapping[str, Any] = "rtn",
    out_format: str = "lowbit",
    calibration: Calibration | str | os.PathLike[str] | Sequence[Any] | None = None,
    weights: Mapping[str, Any] | None = None,
    gptq: GPTQ | None = None,
    awq: AWQ | None = None,
    smooth: float | str | SmoothQuant | None = None,
    activations: str | None = None,
    group_size: int | None = None,
    bits: int | None = None,
    scale_method: str | None = None,
    asym: bool | None = None,
    scale_format: str | None = None,
    pad: bool = True,
    imatrix: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    tensor_types: Mapping[str, str] | Sequence[Any] | None = None,
    output_tensor_type: str | None = None,
    token_embedding_type: str | None = None,
    pure: bool = False,
    leave_output_tensor: bool = False,
    size: int | None = None,
    budget: float | None = None,
    candidates: Sequence[str] | None = None,
    scan_samples: int | None = None,
    scan_length: int = 512,
    tokenizer: Any = None,
    threads: int | None = None,
    compute: str = "fp32",
    workers: int = 1,
    ray: bool | str = False,
    overwrite: bool = False,
    copy_code: bool = False,
    max_shard_size: int | None = None,
    progress: bool | None = None,
    dry_run: bool = False,
    resume: bool | None = None,
) -> QuantizeResult:
    """Quantize ``model`` to ``to`` and write ``out``: the same bytes as ``lowbit quantize``
    with the same options.

    Args:
        model: a path (``.safetensors``, a Hugging Face folder, ``.gguf``), a shipped model
            name (``"smollm2"``, ``"minilm"``), None (SmolLM2), an open checkpoint, or a
            transformers model in memory (with ``tokenizer`` for calibration and GGUF).
        to: a scheme string (``"int4:g128"``, ``"nvfp4"``, ``"fp8_e4m3:ch"``, ``"q4_0"``), a
            llama.cpp mix with ``out_format="gguf"`` (``"q4_k_m"``, ``"iq4_xs"``), or a
            :class:`~lowbit.plans.plan.PrecisionPlan`; None with ``size``/``budget`` and GGUF
            or MLX output (a GGUF or MLX budget).
        out: the folder (``lowbit``, ``compressed-tensors``) or ``.gguf`` file to write.
        method: ``"rtn"`` (default; plan rules may name their own method), ``"gptq"``,
            ``"awq"``, ``"smoothquant"``, ``"smoothquant+gptq"``, ``"hadamard"``,
            ``"hadamard+gptq"`` (MR-GPTQ), ``"hadamard-fold"``, ``"hadamard-fold+gptq"``, or a
            :class:`~lowbit.methods.gptq.GPTQ` / ``MRGPTQ`` / ``AWQ`` / ``SmoothQuant`` with
            its settings.
        weights: tensors already quantized as the plan says (name -> QuantizedTensor), written
            as they are, with ``method`` the record (Mapping) of how they were made.
        gptq, awq: the settings of a method's GPTQ or AWQ step when ``method`` is a name
            (``"hadamard-fold+gptq"`` with ``gptq=lowbit.GPTQ(damp=0.05)``).
        out_format: ``"lowbit"`` (default), ``"compressed-tensors"``, ``"gguf"`` or ``"mlx"``
            (mlx-lm's folder: ``to`` an MLX mode (``affine`` by default, ``mxfp4``, ``mxfp8``,
            ``nvfp4``) or mixed recipe (``mixed_3_6``), ``bits`` and ``group_size`` as
            ``mlx_lm.convert``'s ``--q-bits``/``--q-group-size``; rtn, gptq or awq; or
            ``size``/``budget``).
        calibration: a :class:`~lowbit.calibration.data.Calibration` or what it takes as a
            source (``"default"``, a ``.txt``/``.jsonl`` path); None: the default text from
            token 32,768 (disjoint from what ``lowbit eval`` scores).
        smooth: SmoothQuant's migration strength before rounding (``"search"``: per layer
            group; a float in [0, 1]; or a ``SmoothQuant``), with ``method`` ``"rtn"`` or
            ``"gptq"``; ``method="smoothquant"`` is ``smooth="search"``.
        activations: the quantized layers' input format (``"int8"``, ``"fp8"``; ``"nvfp4"``
            for W4A4 compressed-tensors, whose input scales are calibrated).
        group_size, scale_method, asym, scale_format, pad: modify a scheme string ``to``
            (``--group``, ``--scale-method``, ``--asym``, ``--scale-format``, ``--no-pad``).
        imatrix: llama.cpp importance matrix for a GGUF mix or budget.
        tensor_types, output_tensor_type, token_embedding_type, pure, leave_output_tensor:
            llama-quantize's overrides of a mix.
        size, budget: a GGUF or MLX budget (bytes, or bits per quantized weight), chosen from
            ``candidates`` (GGUF types; MLX grids ``"3bit-g64"``) by measured damage on
            ``scan_samples`` windows of ``scan_length`` tokens.
        tokenizer: an in-memory model's tokenizer.
        threads, compute, workers, ray: calibrated methods' torch threads, forward precision
            (``fp32``, ``bf16``, ``auto``), worker processes and Ray cluster.
        overwrite: replace an output lowbit wrote (anything else is refused).
        copy_code: also copy the source folder's ``.py`` files.
        max_shard_size: bytes per safetensors shard.
        progress: bars (None: on a terminal or in Jupyter; True: always; False: never).
        dry_run: plan only; nothing is written (``details`` holds the applied plan).
        resume: GPTQ in one process keeps a resume record beside ``out`` after every block
            (``.OUT.lowbit-resume``): None (default) continues from a matching record and
            starts over (with a warning) from one that does not match; True requires one
            (``--resume``); False keeps none.

    Returns:
        A :class:`~lowbit.jobs.results.QuantizeResult` (a
        :class:`~lowbit.jobs.results.GGUFResult` for mixes and budgets): the output, its
        bytes, the method's record, and the seconds of the whole call by part; ``details``
        (and ``result[key]``) is what ``lowbit quantize --json`` prints.

    Raises:
        LowbitError: a bad argument or combination, an unreadable source, an output that would
            replace an input or something lowbit did not write.
    """
    if out_format == "mlx":  # a budget to mlx_budget, else quantize_to_mlx
        if asym or scale_format is not None:
            raise LowbitError("asym/scale_format do not apply to out_format='mlx' (MLX's affine "
                              "grid has its bias; scales are in the model dtype)")  # fmt: skip
        calib = _calibration(calibration)
        return mlx_job(
            model, to, out, method=(awq if method == "awq" else gptq) or method,
            calibration=calib, scan_text=_text_of(calib), bits=bits, group_size=group_size,
            size=size, budget=budget, candidates=candidates, scan_samples=scan_samples,
            scan_length=scan_length, tokenizer=tokenizer, threads=threads, compute=compute,
            overwrite=overwrite, copy_code=copy_code, progress=progress, dry_run=dry_run,
            scale_method=scale_method,
        )  # fmt: skip
    if out_format not in OUT_FORMATS:
        formats = ", ".join((*OUT_FORMATS, "mlx"))
        raise LowbitError(f"out_format {out_format!r}: one of {formats}")
    asked = (method, smooth, gptq, awq)  # as given, before the names are unfolded
    name, settings = ("rtn", None) if isinstance(method, Mapping) else _method_parts(method)
    if isinstance(settings, GPTQ):
        gptq = settings
    elif isinstance(settings, AWQ):
        awq = settings
    if name == "smoothquant":
        smooth = settings if settings is not None else (smooth or "search")
        name, settings = "rtn", None
    elif name == "smoothquant+gptq":
        smooth, name = smooth or "search", "gptq"
    out_path = None if out is None else Path(out)
    if out is not None and not str(out).strip():
        raise LowbitError("out is empty; give a folder (or .gguf file) to write")
    if threads is not None and threads < 1:
        raise LowbitError(f"threads must be >= 1, got {threads}")
    if workers < 1:
        raise LowbitError(f"workers must be a positive integer, got {workers}")
    gptq_cfg = gptq or GPTQ()
    if is_gguf_mix(to, out_format) or (out_format == "gguf" and (size or budget) and to is None):
        if name not in ("rtn", "gptq") or smooth is not None or asym:
            raise LowbitError(
                "llama.cpp's GGUF types are rounded as llama.cpp does (rtn), or with gptq onto "
                "the same grids"
            )
        with open_source(model, tokenizer=tokenizer, near=out_path) as ckpt:
            if to is not None:
                return gguf_mix(
                    ckpt, str(to), out_path, imatrix=imatrix,
                    method=gptq_cfg if name == "gptq" else "rtn", calibration=_calibration(calibration),
                    tensor_types=tensor_types, output_tensor_type=output_tensor_type,
                    token_embedding_type=token_embedding_type, pure=pure,
                    leave_output_tensor=leave_output_tensor, overwrite=overwrite,
                    threads=threads, compute=compute, progress=progress, dry_run=dry_run,
                    resume=resume,
                )  # fmt: skip
            return gguf_budget(
                ckpt, out_path, size=size, bits_per_weight=budget, candidates=candidates,
                imatrix=imatrix, method=gptq_cfg if name == "gptq" else "rtn",
                calibration=_calibration(calibration),
                scan_text=_text_of(_calibration(calibration)), scan_samples_count=scan_samples,
                scan_length=scan_length, overwrite=overwrite, threads=threads,
                compute=compute, progress=progress, dry_run=dry_run, resume=resume,
            )  # fmt: skip
    if (
        isinstance(to, str)
        and is_gguf_mix(to, "gguf")
        and to.strip().upper() not in ("Q4_0", "Q5_0", "Q8_0", "NVFP4")
    ):
        raise LowbitError(
            f"to={to!r} is llama.cpp's {mixes.mix(to.strip()).name} mix, which writes GGUF: "
            "add out_format='gguf'"
        )
    if size or budget:
        raise LowbitError(
            "size/budget choose GGUF types here (out_format='gguf'); for lowbit schemes, solve "
            "a plan from a sensitivity scan (lowbit.plans.mixed.plan_for_budget) and pass it "
            "as to="
        )
    if imatrix is not None or tensor_types or output_tensor_type or token_embedding_type:
        raise LowbitError("imatrix and the tensor-type overrides go with a llama.cpp mix "
                          "(to='q4_k_m', out_format='gguf')")  # fmt: skip
    if to is None:
        raise LowbitError("say what to quantize to: to='int4:g128', a mix, or a PrecisionPlan")
    opts = {"group_size": group_size, "scale_method": scale_method, "asym": True if asym else None,
            "scale_format": scale_format}  # fmt: skip
    plan = _plan_of(to, activations, pad, opts)
    rounding = (
        "llama.cpp" if isinstance(to, str) and to.strip().lower() in ("q4_0", "q8_0") else "auto"
    )
    if not dry_run and _classic(asked[0], asked[1], plan, workers, ray, asked[2], asked[3],
                                weights):  # fmt: skip
        # round to nearest, GPTQ, AWQ, SmoothQuant alone, or weights with their record: the
        # calibrated API's own checks and messages, then the same writer
        t0 = time.perf_counter()
        with open_source(model, tokenizer=tokenizer, near=out_path) as ckpt:
            summary = calibrated.quantize_model(
                ckpt, plan, out_path if out_path is not None else "", method=method,
                calibration=calibration, out_format=out_format, gguf_rounding=rounding,
                overwrite=overwrite, copy_code=copy_code, max_shard_size=max_shard_size,
                threads=threads, progress=progress, weights=weights, compute=compute,
                resume=resume,
            )  # fmt: skip
            parts = summary.pop("seconds_parts", {})
            seconds = {**parts, "total": time.perf_counter() - t0}
            summary["seconds"] = seconds
            return QuantizeResult(
                details=summary, out=out_path, out_format=out_format, source=str(ckpt.path),
                bytes=int(summary["bytes"]), tensors=int(summary["totals"]["tensors"]),
                seconds=seconds, method=summary.get("method"),
            )  # fmt: skip
    if weights is not None:
        raise LowbitError("weights= go with a method record (Mapping) or round to nearest")
    calib = _calibration(calibration)
    with open_source(model, tokenizer=tokenizer, near=out_path) as ckpt:
        return quantize_plan(
            ckpt, plan, out_path, name=name, gptq=gptq, awq=awq, smooth=smooth,
            out_format=out_format, calib=calib, threads=threads, compute=compute,
            workers=workers, ray=ray, overwrite=overwrite, copy_code=copy_code,
            max_shard_size=max_shard_size, progress=progress, dry_run=dry_run,
            rounding=rounding, resume=resume,
        )  # fmt: skip


def _classic(
    method: Any, smooth: Any, plan: Any, workers: int, ray: Any, gptq: Any, awq: Any,
    weights: Any,
) -> bool:  # fmt: skip
    """Whether :func:`lowbit.calibration.calibrated.quantize_model` does this job as asked."""
    if isinstance(method, Mapping) or weights is not None:
        return True
    plain = method is None or (isinstance(method, str) and method in calibrated.METHODS) or (
        isinstance(method, GPTQ | AWQ | SmoothQuant) and not isinstance(method, MRGPTQ)
    )  # fmt: skip
    acts = [plan.activations, *(getattr(r, "activations", None) for r in plan.rules)]
    nvfp4_acts = "nvfp4" in acts
    return (plain and smooth is None and workers == 1 and not ray and gptq is None
            and awq is None and not nvfp4_acts)  # fmt: skip


def _calibration(calibration: Any) -> Calibration:
    if isinstance(calibration, Calibration):
        return calibration
    if calibration is None:
        return Calibration()
    return Calibration(source=calibration)


def _text_of(calib: Calibration) -> Any:
    return getattr(calib, "source", "default")


def quantize_plan(
    ckpt: Any,
    plan: Any,
    out: Path | None,
    *,
    name: str,
    gptq: GPTQ | None,
    awq: AWQ | None,
    smooth: Any,
    out_format: str,
    calib: Calibration,
    threads: int | None,
    compute: str,
    workers: int,
    ray: bool | str,
    overwrite: bool,
    copy_code: bool,
    max_shard_size: int | None,
    progress: bool | None,
    dry_run: bool,
    rounding: str,
    clock: Stopwatch | None = None,
    resume: bool | None = None,
) -> QuantizeResult:
    """The plan route of :func:`quantize_model` on an open checkpoint: ``lowbit quantize``'s
    sequence (plan, method, folds and calibration, input scales, write). ``name`` is a method
    name of :data:`METHODS` (SmoothQuant as ``smooth``), ``gptq``/``awq`` the settings of its
    GPTQ or AWQ step (None: the defaults); ``clock`` collects the seconds by part (the caller's, to add its own)."""
    clock = clock or Stopwatch()
    check_unrotated(ckpt)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        applied = plan_model(ckpt, plan, out_format=out_format, gguf_rounding=rounding)
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if any(t.activations == "nvfp4" for t in applied.quantized) and (
        out_format != "compressed-tensors"
    ):
        raise LowbitError(
            "nvfp4 activations (W4A4) are written as compressed-tensors' input_global_scale: "
            "out_format='compressed-tensors' (with to='nvfp4')"
        )
    sizes = [output_nbytes(t, out_format) for t in applied.tensors]
    totals = applied.totals()
    totals["out_bytes"] = sum(sizes)
    if dry_run:
        doc = {"source": str(ckpt.path), "out_format": out_format, "totals": totals,
               "tensors": [t.to_dict() for t in applied.tensors]}  # fmt: skip
        return QuantizeResult(
            details=doc, out=None, out_format=out_format, source=str(ckpt.path),
            bytes=totals["out_bytes"], tensors=len(applied.tensors),
            seconds=clock.to_dict(), dry_run=True,
        )  # fmt: skip
    if out is None:
        raise LowbitError("say where to write: out='folder' (or a .gguf file)")
    done: Any = None
    method = record = fold = None
    source = ckpt
    rotation.check_rotation(name, out_format)
    rotation.check_experts(name, out_format, applied)
    if name == "hadamard" and out_format == "compressed-tensors":
        # rounded by the writer from the rotated weights: NVFP4's fused groups share a scale
        blocks = rotation.rotation_blocks(ckpt, applied)
        source = rotation.RotatedCheckpoint(ckpt, blocks)
        record = rotation.rotation_record({"method": "hadamard"}, blocks)
    elif name == "hadamard":
        done, record = rotation.rotated_rtn(ckpt, applied)
    # rule methods run their method without method=; gptq and awq never mix (one run)
    base = {"hadamard": "rtn", "hadamard+gptq": "gptq", "hadamard-fold": "rtn",
            "hadamard-fold+gptq": "gptq"}.get(name, name)  # fmt: skip
    named = calibrated_method([t.method for t in applied.quantized], base)
    if name in ("hadamard", "hadamard-fold") and named != "rtn":
        raise LowbitError(
            f"--method {name} rounds to nearest, but plan rules ask for {named}: give "
            f"them method: rtn, or use --method {name}+gptq"
        )
    if name in rotation.FOLDING:
        source, fold = rotation.fold_source(ckpt, plan)
        if name == "hadamard-fold":
            record = {"method": "rtn", "fold": fold}
    if resume and (smooth is not None or "gptq" not in (base, named)):
        raise LowbitError("--resume continues a GPTQ run (--method gptq); this run has no GPTQ")
    kept = None
    try:
        if smooth is not None or "awq" in (name, named):
            with clock.part("calibration"):
                opts = {"name": name, "gptq": gptq, "awq": awq, "smooth": smooth,
                        "out_format": out_format, "calib": calib, "threads": threads,
                        "compute": compute, "workers": workers, "ray": ray,
                        "overwrite": overwrite, "progress": progress}  # fmt: skip
                source, done, method = _awq_or_smooth(ckpt, plan, applied, out, opts)
        elif "gptq" in (base, named):
            with clock.part("calibration"):
                if out.exists() and not overwrite:  # fail before minutes of calibration
                    raise LowbitError(f"{out} exists; pass --overwrite to replace it")
                g = gptq or GPTQ()
                cfg = g
                if workers == 1 and not ray and resume is not False:
                    kept = Resume(resume_folder(out), require=resume is True)
                elif resume:
                    raise LowbitError(
                        "--resume continues a one-process GPTQ run: drop --workers/--ray"
                    )
                if name == "hadamard+gptq" and not isinstance(g, MRGPTQ):
                    cfg = MRGPTQ(damp=g.damp, act_order=g.act_order, sequential=g.sequential)
                run = calibrated_weights(
                    source, plan, cfg, calib,
                    default_method=getattr(cfg, "name", "gptq").split("+")[-1]
                    if name in (*rotation.ROTATING, *rotation.FOLDING) else name,
                    threads=threads, progress=progress, compute=compute, workers=workers, ray=ray,
                    resume=kept,
                )  # fmt: skip
                done, method = run.weights, run.record
                if name == "hadamard+gptq":
                    done, method = rotation.unwrap(done, method)
            if fold is not None:
                method = {**method, "fold": fold}
        if method is not None:  # GPTQ's solve, AWQ's search: the rest is calibration
            sec = method.get("seconds", {})
            clock.split("calibration", {"solve": sec.get("solve", sec.get("search", 0.0))})
        inputs = None
        if any(t.activations == "nvfp4" for t in applied.quantized):
            if out.exists() and not overwrite:  # fail before the calibration forwards
                raise LowbitError(f"{out} exists; pass --overwrite to replace it")
            with clock.part("input scales"):
                done = ct_weights(source, applied, done)
                inputs = nvfp4_input_scales(
                    source, {t.name: done[t.name] for t in applied.quantized}, calib,
                    threads=threads, progress=progress, compute=compute,
                    rotations=rotated_tensors(method if record is None else record),
                )  # fmt: skip
        with clock.part("write"):
            result = write_plan(
                source, plan, out, out_format=out_format, gguf_rounding=rounding,
                overwrite=overwrite, copy_code=copy_code, max_shard_size=max_shard_size,
                progress=progress, weights=done, method=method if record is None else record,
                input_scales=None if inputs is None else inputs.scales,
            )  # fmt: skip
        clock.split("write", {"quantize": result["seconds_parts"]["quantize"]})
    finally:
        if kept is not None:
            kept.close()  # the lock (a kill leaves the record for the next run)
    if kept is not None:
        kept.remove()  # the output is whole: nothing to resume
    if method is not None or record is not None:
        result["method"] = method if record is None else record
    if inputs is not None:
        result["input_scales"] = inputs.record
    del result["seconds_parts"]
    seconds = clock.to_dict()  # the whole call, by part (a caller may add parts and redo it)
    result["seconds"] = seconds
    return QuantizeResult(
        details=result,
        out=out,
        out_format=out_format,
        source=str(ckpt.path),
        bytes=int(result["bytes"]),
        tensors=len(applied.tensors),
        seconds=seconds,
        method=result.get("method"),
    )


def _awq_or_smooth(
    ckpt: Any, plan: Any, applied: Any, out: Path, opts: Mapping[str, Any]
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """AWQ's or SmoothQuant's folded checkpoint, weights and record: written from the folded
    checkpoint, whatever the output format, so the folded norms and biases replace the
    originals. ``opts``: :func:`quantize_plan`'s settings by name."""
    name, smooth, gptq, awq = opts["name"], opts["smooth"], opts["gptq"], opts["awq"]
    calib, threads, compute, progress = (
        opts["calib"],
        opts["threads"],
        opts["compute"],
        opts["progress"],
    )
    if smooth is not None and name not in ("rtn", "gptq"):
        raise LowbitError(
            f"--smooth rounds to nearest after its folds (or, with --method gptq, runs GPTQ "
            f"on the folded model): drop --method {name}"
        )
    if smooth is not None and opts["out_format"] == "gguf":
        raise LowbitError(
            "--smooth prepares W8A8 models (per-token activations), which GGUF cannot declare: "
            "write --out-format compressed-tensors (vLLM) or lowbit"
        )
    if out.exists() and not opts["overwrite"]:  # fail before minutes of calibration
        raise LowbitError(f"{out} exists; pass --overwrite to replace it")
    cfg: Any
    if smooth is not None:
        acts = {t.activations for t in applied.quantized if t.activations}
        if isinstance(smooth, SmoothQuant):
            cfg = smooth
        else:
            if len(acts) != 1:
                raise LowbitError(
                    "--smooth prepares activations for W8A8: give --w8a8 int8|fp8 (or one "
                    f"--activations format){'' if not acts else f', not several ({sorted(acts)})'}"
                )
            cfg = SmoothQuant(alpha=parse_alpha(str(smooth)), activations=acts.pop())
    else:
        cfg = awq or AWQ()
    if isinstance(cfg, SmoothQuant) and name == "gptq":
        if opts["workers"] != 1 or opts["ray"]:
            raise LowbitError("SmoothQuant calibrates in one process: drop --workers/--ray")
        both = smoothquant_gptq_weights(
            ckpt, plan, cfg, gptq or GPTQ(), calib, threads=threads, progress=progress,
            compute=compute,
        )  # fmt: skip
        return both.checkpoint, both.weights, both.record
    run = calibrated_weights(
        ckpt, plan, cfg, calib, default_method=name, threads=threads, progress=progress,
        compute=compute, workers=opts["workers"], ray=opts["ray"],
    )  # fmt: skip
    return run.checkpoint, run.weights, run.record
