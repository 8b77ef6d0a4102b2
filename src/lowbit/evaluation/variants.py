"""The quality a model keeps under quantization: the original and its variants, measured together.

:func:`evaluate_variants` is what ``lowbit eval`` runs: it builds the original model, each
quantized variant (lowbit checkpoints or other checkpoints on disk, or schemes quantized in
memory without writing anything), optionally each with simulated W8A8 activations, and measures
all of them in one pass over the same data:

- causal LMs: perplexity over fixed windows, and against the original the mean KL divergence of
  next-token distributions and top-1 agreement (:func:`compare_causal`; the same arithmetic as
  ``lowbit.evaluation.perplexity.perplexity``, with the original's log-probabilities computed once per
  window for every variant instead of once per variant);
- encoders: mean/min cosine similarity of sentence embeddings against the original's, and
  nearest-neighbour agreement (:func:`compare_encoder`, as ``lowbit.evaluation.perplexity.embedding_fidelity``).

Sizes are tensor data bytes: as stored for checkpoints on disk, as a lowbit checkpoint would
store them for in-memory variants. Bits per weight count every stored bit (codes, scales, zero
points) of the tensors the plan quantizes (for the original: of those same tensors as stored).

Measuring lives in :mod:`lowbit.evaluation._compare` (:class:`Variant`, :func:`compare_causal`,
:func:`compare_encoder`, re-exported here); this module builds the variants and runs them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lowbit._optional import require
from lowbit.calibration.blocks import _calibration
from lowbit.calibration.data import Calibration, decoder_windows
from lowbit.checkpoints import open_checkpoint
from lowbit.checkpoints.lowbit_format.checkpoint import LowbitCheckpoint, is_lowbit_checkpoint
from lowbit.checkpoints.readers import Checkpoint
from lowbit.checkpoints.streaming import (
    checkpoint_tensors,
    open_model,
    plan_model,
    quantized_weights,
)
from lowbit.checkpoints.tokenizer import build_tokenizer
from lowbit.errors import LowbitError
from lowbit.evaluation._compare import (
    DEFAULT_SENTENCES,
    DEFAULT_TOKENS,
    Variant,
    _act_spec,
    _compare_causal_groups,
    _compare_encoder_groups,
    _with_activations,
    compare_causal,
    compare_encoder,
)
from lowbit.evaluation.act_modes import LLAMACPP, act_mode
from lowbit.evaluation.calibrated_variants import (
    awq_variant,
    gptq_variant,
    smooth_gptq_variant,
    variant_plan,
)
from lowbit.evaluation.perplexity import (
    DEFAULT_BATCH,
    _check_positive,
    _fidelity_sentences,
    load_text,
)
from lowbit.evaluation.rotated import fold_pairs, folded_variant, rotated_variant
from lowbit.methods.awq import AWQ
from lowbit.methods.gptq import GPTQ
from lowbit.methods.hadamard import rotation_block
from lowbit.methods.mr_gptq import MRGPTQ
from lowbit.methods.smoothquant import SmoothQuant
from lowbit.models._compute import check_compute
from lowbit.models.build import build_model, load_model
from lowbit.plans.plan import PrecisionPlan
from lowbit.plans.rules import action_label, activation_format

__all__ = [
    "DEFAULT_SCHEMES",
    "Variant",
    "compare_causal",
    "compare_encoder",
    "evaluate_variants",
    "variant_plan",
]

#: The schemes ``lowbit eval`` compares when given none (issue 4's list).
DEFAULT_SCHEMES = ("int8:ch", "int4:g128", "int4:g128:asym", "nf4", "fp8_e4m3:ch", "mxfp4")


# ---------------------------------------------------------------------------------------
# Building the variants
# ---------------------------------------------------------------------------------------


def _stored_bits(checkpoint: Checkpoint, names: Sequence[str]) -> float | None:
    """Stored bits per value of the named tensors as the checkpoint holds them."""
    numel = sum(math.prod(checkpoint.shape(n)) for n in names)
    if not numel:
        return None
    return sum(checkpoint.info(n).nbytes for n in names) * 8 / numel


def _default_quantized(checkpoint: Checkpoint) -> list[str]:
    """Names of the tensors the default plan quantizes (the 2-D linear weights)."""
    plan = PrecisionPlan(default=PrecisionPlan.uniform("int8").default)
    return [t.name for t in plan.apply(checkpoint_tensors(checkpoint)).quantized]


def _dominant_dtype(checkpoint: Checkpoint, names: Sequence[str]) -> str:
    counts: dict[str, int] = {}
    for n in names:
        d = str(checkpoint.dtype(n))
        counts[d] = counts.get(d, 0) + math.prod(checkpoint.shape(n))
    return max(counts, key=lambda k: counts[k]) if counts else "?"


def _scheme_variant(checkpoint: Checkpoint, spec: str, progress: bool | None) -> Variant:
    plan = variant_plan(spec)
    applied = plan_model(checkpoint, plan)
    weights: dict[str, np.ndarray] = {}
    qbytes = 0
    qnumel = 0
    for t, qt in quantized_weights(checkpoint, applied, progress=progress):
        weights[t.name] = qt.dequantize(np.float32)
        qbytes += qt.nbytes
        qnumel += qt.numel
    model = build_model(checkpoint, weights=weights, progress=progress)
    del weights
    totals = applied.totals()
    if totals["quantized_bytes"] != qbytes:  # internal invariant: the plan's bytes are exact
        raise AssertionError(f"{spec}: planned {totals['quantized_bytes']} bytes, got {qbytes}")
    return Variant(
        name=spec,
        format=action_label(plan.default),
        model=model,
        bits_per_weight=qbytes * 8 / qnumel if qnumel else None,
        nbytes=totals["bytes"],
        source="memory",
        extra={"quantized_tensors": totals["quantized"]},
    )


def _open_disk_variant(path: Path, original: Any) -> Any:
    """A QUANTIZED path opened from its headers, checked against the original: called for
    every path before the reference pass, so a wrong path fails at once, not minutes later."""
    if not is_lowbit_checkpoint(path):
        return open_checkpoint(path)
    ckpt = LowbitCheckpoint(path)
    if set(ckpt.names()) != set(original.names()):
        raise LowbitError(
            f"{path} was quantized from {ckpt.manifest.get('source', {}).get('path')}, whose "
            f"tensors differ from {original.path}"
        )
    return ckpt


def _disk_variant(path: Path, original: Any, progress: bool | None) -> Variant:
    if is_lowbit_checkpoint(path):
        ckpt = _open_disk_variant(path, original)
        totals = ckpt.manifest.get("totals") or {}
        labels = sorted(
            {
                e.get("label", "?")
                for n in ckpt.names()
                if (e := ckpt.entry(n))["kind"] == "quantized"
            }
        )
        model = load_model(path, progress=progress)
        acts = sorted(set(model.lowbit_activations.values()))
        fmt = ", ".join(labels) or "nothing quantized"
        if acts:
            fmt += f" + {'/'.join(acts)} activations"
        return Variant(
            name=path.name,
            format=fmt,
            model=model,
            bits_per_weight=totals.get("bits_per_weight"),
            nbytes=ckpt.nbytes,
            source="disk",
            extra={"path": str(path)},
        )
    ckpt = open_checkpoint(path)
    names = _default_quantized(ckpt)
    fmt = f"{_dominant_dtype(ckpt, names)} {ckpt.format}"
    extra: dict[str, Any] = {"path": str(path)}
    # a compressed-tensors folder that declares input quantization (W8A8, W4A4) is measured
    # with its inputs quantized as served, NVFP4's with its stored input_global_scale
    stored = getattr(ckpt, "input_activations", dict)()
    if stored:
        modes = sorted({m for m, _ in stored.values()})
        how = "/".join(modes) + " activations as stored"
        how += " (input_global_scale)" if "nvfp4" in modes else " (dynamic)"
        fmt += f" + {how}"
        extra["activations_applied"] = f"{how} on {len(stored)} layers"
    return Variant(
        name=path.name,
        format=fmt,
        model=build_model(ckpt, progress=progress),
        bits_per_weight=_stored_bits(ckpt, names),
        nbytes=ckpt.nbytes,
        source="disk",
        extra=extra,
        stored_activations=stored or None,
    )


METHODS = ("rtn", "gptq", "awq", "hadamard", "hadamard+gptq", "hadamard-fold", "hadamard-fold+gptq")


def _methods(methods: Sequence[str]) -> list[str]:
    out = [str(m).strip().lower() for m in methods]
    bad = [m for m in out if m not in METHODS]
    if bad or not out:
        raise LowbitError(
            f"unknown method {bad[0] if bad else ''!r}; allowed: {', '.join(METHODS)}"
        )
    return out


def _gptq_variant(
    ckpt: Any, spec: str, calibration: Any, gptq: Any, text: Any, tokens: int | None,
    body: str, label: str, causal: bool, sentences: int, seed: int, threads: Any, progress: Any,
    compute: str = "fp32",
) -> Variant:  # fmt: skip
    """The GPTQ row of a scheme (or AWQ's, SmoothQuant's, when ``gptq`` is their settings),
    calibrated on data this evaluation never measures."""

    calib = _calibration(calibration, Calibration)
    same_text = (calib.is_default and text is None) or (
        not calib.is_default
        and text is not None
        and Path(calib.source).resolve() == Path(text).resolve()
    )
    avoid = (tokens if tokens is not None else 1 << 62) if causal and same_text else 0
    exclude: Sequence[str] = ()
    if not causal:
        exclude, _ = _fidelity_sentences(None, body, label, sentences, seed)
    make = (
        smooth_gptq_variant
        if isinstance(gptq, tuple)
        else awq_variant
        if isinstance(gptq, (AWQ, SmoothQuant))
        else gptq_variant
    )
    return make(
        ckpt, spec, calib, gptq, avoid_tokens=avoid, exclude=exclude, threads=threads,
        progress=progress, compute=compute,
    )  # fmt: skip


def evaluate_variants(
    model: Any = None,
    quantized: Sequence[str | Path] = (),
    schemes: Sequence[str] | None = None,
    *,
    w8a8: str | None = None,
    act: str | None = None,
    kv: str | None = None,
    tokens: int | None = DEFAULT_TOKENS,
    window: int = 512,
    stride: int | None = None,
    text: str | Path | None = None,
    sentences: int = DEFAULT_SENTENCES,
    seed: int = 0,
    threads: int | None = None,
    progress: bool | None = None,
    methods: Sequence[str] = ("rtn",),
    calibration: Any = None,
    gptq: Any = None,
    awq: Any = None,
    smooth: Any = None,
    batch: int = DEFAULT_BATCH,
    compute: str = "fp32",
) -> dict[str, Any]:
    """Measure a model and its quantized variants; what ``lowbit eval`` prints.

    Args:
        model: the original (path or shipped name; default SmolLM2).
        quantized: checkpoints of it on disk (lowbit checkpoints, GGUF files ...).
        schemes: scheme strings quantized in memory with the default plan (2-D linear weights;
            default :data:`DEFAULT_SCHEMES` when ``quantized`` is empty too, pass ``[]`` for
            none).
        w8a8: also measure every model with per-token activations in this format (``int8``,
            ``fp8_e4m3``) on every linear layer but the LM head.
        act, kv: instead of ``w8a8``, an activation mode as vLLM computes it, and/or the KV
            cache in ``fp8``/``int8`` (``lowbit.evaluation.act_modes``).
        tokens, window, stride: perplexity data (causal LMs): the first ``tokens`` tokens,
            windows of ``window`` every ``stride``.
        text: a UTF-8 text file (default: CPython's ``pydoc_data.topics``).
        sentences, seed: how many sentences encoders are compared on, drawn from the text.
        threads: torch threads (default: the usable cores, see
            ``lowbit.evaluation.perplexity.default_threads``).
        progress: tqdm bars (``None``: only on a terminal).
        methods: how each scheme is quantized: ``rtn`` (round to nearest), ``gptq``
            (``lowbit.calibration.gptq``; one more row per scheme, named ``"{scheme} gptq"``)
            ``awq``, ``hadamard`` (``lowbit.evaluation.rotated``), ``hadamard+gptq``
            (MR-GPTQ, :class:`lowbit.methods.mr_gptq.MRGPTQ` with ``gptq``'s settings: GPTQ
            in the block-Hadamard-rotated basis, inputs rotated online; rows
            ``"{scheme} hadamard+gptq"``), ``hadamard-fold`` and ``hadamard-fold+gptq``
            (the rotation folded offline into every value -> output projection pair,
            ``lowbit.methods.hadamard_fold``, then rounded to nearest or GPTQ'd with
            ``gptq``'s settings; no rotation at run time).
        calibration: GPTQ's, AWQ's and SmoothQuant's calibration data (``lowbit.calibration.data.Calibration``;
            default: the default text from token 32,768, never a token or sentence this
            evaluation measures).
        gptq: the :class:`lowbit.methods.gptq.GPTQ` settings (default ``GPTQ()``).
        awq: the :class:`lowbit.methods.awq.AWQ` settings of ``methods`` ``awq`` (default
            ``AWQ()``; ``lowbit.calibration.awq``; rows ``"{scheme} awq"``).
        smooth: SmoothQuant with ``w8a8`` or ``act``: ``True`` (α searched) or a
            :class:`lowbit.methods.smoothquant.SmoothQuant` (its activations are ``w8a8``'s
            format or the ``act`` mode);
            one more row per scheme, ``"{scheme} smoothquant"``, rounded to nearest after the
            folds, and with ``gptq`` in ``methods`` one more, ``"{scheme} smoothquant+gptq"``:
            GPTQ of the folded model (``calibrated_variants.smooth_gptq_variant``).
        batch: causal LMs: windows per forward, at most (fewer where their float32 logits
            would pass 1 GiB; ``lowbit.evaluation.perplexity.batch_size``). The measured
            facts say the batch used.
        compute: precision of the models' matrix products (and of calibration's forward
            passes): ``fp32`` (default), ``bf16`` or ``auto`` (bf16 where the CPU's
            bfloat16 units are timed faster; ``lowbit.models._compute``). The measured facts say which ran.

    Returns:
        ``{"model", "kind", "measured", "rows"}``; each row has name, format, activations,
        bits_per_weight, bytes, size_source and the measures, plus ``change`` (relative
        perplexity change against the original) for causal LMs.

    Raises:
        LowbitError: unreadable models or texts, bad schemes, variants of another model.
    """
    for module in ("torch", "transformers"):  # before any model or text is read
        require(module, extra="models", what="evaluating models")

    sim = _act_spec(w8a8, act, kv)
    llamacpp = sim is not None and LLAMACPP in sim.split("+")
    if schemes is None:  # --act llamacpp measures files only
        schemes = [] if quantized or llamacpp else list(DEFAULT_SCHEMES)
    for spec in schemes:  # a bad scheme string fails before any model loads
        variant_plan(spec)
    _check_positive("batch", batch)
    check_compute(compute)
    methods = _methods(methods)
    if llamacpp and schemes:
        raise LowbitError(
            "--act llamacpp measures GGUF files as llama.cpp runs them; in-memory schemes have "
            "no GGUF weight types: give --schemes none"
        )
    if llamacpp and smooth not in (None, False):
        raise LowbitError("--act llamacpp measures GGUF files as they are: no SmoothQuant rows")
    act = activation_format(w8a8) if w8a8 else act_mode(act) if act and not llamacpp else None
    if smooth is not None and smooth is not False:
        if act is None:
            raise LowbitError(
                "SmoothQuant (smooth) prepares activations for quantization: give w8a8 or act"
            )
        base = smooth if isinstance(smooth, SmoothQuant) else SmoothQuant()
        smooth = SmoothQuant(alpha=base.alpha, grid=base.grid, activations=act, rows=base.rows)
    else:
        smooth = None
    label, body = load_text(text)
    ckpt = open_model(model)
    if {"hadamard-fold", "hadamard-fold+gptq"} & set(methods):  # refused before any pass
        for spec in schemes:
            fold_pairs(ckpt, rotation_block(variant_plan(spec).default))
    tokenizer = build_tokenizer(ckpt)
    reference = build_model(ckpt, progress=progress)
    names = _default_quantized(ckpt)
    original = Variant(
        name="original",
        format=f"{_dominant_dtype(ckpt, names)} {ckpt.format}",
        model=reference,
        bits_per_weight=_stored_bits(ckpt, names),
        nbytes=ckpt.nbytes,
        source="disk",
    )
    # variants are built when measured and released after (one variant model alive at a time)
    makers: list[Callable[[], Variant]] = [lambda: original]
    for q, opened in [(None, ckpt)] + [(q, _open_disk_variant(Path(q), ckpt)) for q in quantized]:
        # every path opened now (a bad one fails before the reference pass)
        if llamacpp and opened.format != "gguf":
            raise LowbitError(
                f"--act llamacpp rounds activations by each layer's GGUF weight type; "
                f"{ckpt.path if q is None else q} is {opened.format}, not a GGUF file"
            )
    for q in quantized:
        makers.append(lambda q=q: _disk_variant(Path(q), ckpt, progress))
    causal = reference.get_output_embeddings() is not None
    base_gptq = gptq if gptq is not None else GPTQ()
    mr = MRGPTQ(**{f.name: getattr(base_gptq, f.name) for f in dataclasses.fields(GPTQ)})
    for spec in schemes:
        if "rtn" in methods:
            makers.append(lambda spec=spec: _scheme_variant(ckpt, spec, progress))
        if "hadamard" in methods:
            makers.append(
                lambda spec=spec: rotated_variant(ckpt, variant_plan(spec), spec, progress)
            )
        for how, make in (
            ("hadamard-fold", lambda c, spec: _scheme_variant(c, spec, progress)),
            ("hadamard-fold+gptq", lambda c, spec: _gptq_variant(
                c, spec, calibration, base_gptq, text, tokens, body, label, causal, sentences,
                seed, threads, progress, compute)),
        ):  # fmt: skip
            if how in methods:
                makers.append(
                    lambda spec=spec, how=how, make=make: folded_variant(
                        ckpt, variant_plan(spec), spec, how, lambda c: make(c, spec)
                    )
                )
        for how, cfg in (
            ("gptq", gptq),
            ("hadamard+gptq", mr),
            ("awq", awq or AWQ()),
            ("smooth", smooth),
            ("smooth+gptq", (smooth, base_gptq)),
        ):
            wanted = {"smooth": smooth is not None,
                      "smooth+gptq": smooth is not None and "gptq" in methods}  # fmt: skip
            if wanted.get(how, how in methods):
                makers.append(
                    lambda spec=spec, cfg=cfg: _gptq_variant(
                        ckpt, spec, calibration, cfg, text, tokens, body, label, causal,
                        sentences, seed, threads, progress, compute,
                    )
                )  # fmt: skip
    per_group = 1 if sim is None else 2
    windows = None
    if sim is not None and "nvfp4" in sim.split("+") and causal:
        calib = calibration if calibration is not None else Calibration(samples=16)
        same = calib.is_default and text is None
        windows = decoder_windows(tokenizer, calib, avoid=(tokens or 0) if same else 0)
    groups = [functools.partial(_with_activations, make, sim, windows) for make in makers]
    if causal:
        measured, pairs = _compare_causal_groups(
            groups, len(groups) * per_group, reference, tokenizer, body, label=label,
            window=window, stride=stride, max_tokens=tokens, threads=threads,
            progress=progress, batch=batch, compute=compute,
        )  # fmt: skip
    else:
        measured, pairs = _compare_encoder_groups(
            groups, reference, tokenizer, None, n=sentences, seed=seed, text=body,
            label=label, batch_size=32, threads=threads, progress=progress, compute=compute,
        )  # fmt: skip
    # rows: every model, then every model with simulated activations
    pairs = [pairs[i] for j in range(per_group) for i in range(j, len(pairs), per_group)]
    rows = [{**meta, **r} for meta, r in pairs]
    if causal:
        base = rows[0]["perplexity"]
        for r in rows:
            r["change"] = r["perplexity"] / base - 1.0
    return {
        "model": str(ckpt.path),
        "kind": measured["kind"],
        "measured": measured,
        "rows": rows,
    }
