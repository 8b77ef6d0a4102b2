"""Mixed precision from measured sensitivity, one call each: :func:`scan` (``lowbit
sensitivity``: every quantizable tensor under every candidate scheme) and :func:`mixed_plan`
(``lowbit quantize --budget/--size`` with lowbit schemes: a scan run or read, then the plan
of least predicted damage within the budget). The plan goes to
:func:`lowbit.quantize_model` as ``to=``; a GGUF budget is :func:`lowbit.jobs.gguf.gguf_budget`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from lowbit import _json
from lowbit._progress import progress_bar
from lowbit._workers_cap import check_workers
from lowbit.checkpoints.streaming import checkpoint_tensors, open_model
from lowbit.checkpoints.tokenizer import build_tokenizer
from lowbit.errors import LowbitError
from lowbit.evaluation.scan_samples import is_causal, scan_samples
from lowbit.evaluation.sensitivity import SensitivityResult, sensitivity
from lowbit.plans.mixed import PRESETS, plan_for_budget, preset_plan
from lowbit.plans.plan import PrecisionPlan
from lowbit.quant.scheme_text import parse_scheme

__all__ = ["mixed_plan", "scan"]


def scan(
    model: Any,
    schemes: Sequence[str],
    *,
    text: str | os.PathLike[str] = "default",
    samples: int | None = None,
    length: int = 512,
    measure: str = "exact",
    proxy: str | None = None,
    tensors: Sequence[str] = (),
    exact_schemes: Sequence[str] = (),
    workers: int = 1,
    ray: bool | str = False,
    compute: str = "fp32",
    progress: bool | None = None,
) -> SensitivityResult:
    """Measure every quantizable tensor of ``model`` under every scheme of ``schemes``, as
    ``lowbit sensitivity`` does.

    Args:
        model: a path, a shipped model name or an open checkpoint.
        schemes: candidate scheme strings (``int4:g128``, ``int8:ch`` ...).
        text, samples, length: the scan text (default: lowbit's, a range ``lowbit eval`` does
            not score), its windows (causal LMs) or sentences (encoders), tokens per window.
        measure: ``exact`` (run the model per trial), ``block`` (run the tensor's block per
            trial: :mod:`lowbit.evaluation.block_sensitivity`), ``proxy`` or ``fisher`` (no
            trial run).
        proxy: the proxy reported beside each trial (``input`` or ``fisher``).
        tensors: only tensors matching one of these globs.
        exact_schemes: with ``exact``, only these schemes run the model.
        workers, ray, compute, progress: trial processes, a Ray cluster, the passes'
            precision, bars.

    Raises:
        LowbitError: no scheme or a bad one, a bad combination, a model lowbit cannot build.
    """
    if not schemes:
        raise LowbitError("--schemes needs at least one scheme")
    for s in schemes:  # bad strings fail before a model loads
        parse_scheme(s)
    check_workers(workers, "--workers")
    label = measure
    measure, proxy_kind = measure, proxy or "input"
    if measure == "fisher":
        if proxy == "input":
            raise LowbitError("--measure fisher reports the fisher proxy; drop --proxy input")
        measure, proxy_kind = "proxy", "fisher"
    ckpt = open_model(model)
    tokenizer = build_tokenizer(ckpt)
    kind = "causal" if is_causal(ckpt) else "encoder"
    if proxy_kind == "fisher" and kind != "causal":
        raise LowbitError("the fisher proxy needs a causal LM (its loss is next-token); use proxy")
    calib = scan_samples(kind, tokenizer, text, samples=samples, length=length)
    with progress_bar(None, progress, f"sensitivity ({label})", "trial") as bar:

        def tick(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        return sensitivity(
            ckpt, list(schemes), calib, tokenizer=tokenizer if kind == "encoder" else None,
            measure=measure, proxy=proxy_kind, compute=compute, progress=tick, workers=workers,
            ray=ray, tensors=list(tensors), exact_schemes=list(exact_schemes),
        )  # fmt: skip


def mixed_plan(
    model: Any,
    *,
    budget: float | str | None = None,
    size: int | str | None = None,
    sensitivity_result: SensitivityResult | str | os.PathLike[str] | None = None,
    schemes: Sequence[str] = (),
    base: PrecisionPlan | str | os.PathLike[str] | None = None,
    candidates: Sequence[str] | None = None,
    min_scheme: str | None = None,
    method: str | None = None,
    **scan_options: Any,
) -> tuple[Any, SensitivityResult]:
    """The mixed-precision plan of least predicted damage within a budget, as ``lowbit quantize
    --budget/--size`` solves it (with lowbit schemes).

    Args:
        model: a path, a shipped model name or an open checkpoint.
        budget: stored bits per quantized weight (``4.5``) or a preset's name
            (``q4_k_m_like``: the bits that preset gives this model); or ``size``: bytes.
        sensitivity_result: a scan's result (or its JSON file); None runs :func:`scan` on
            ``schemes`` with ``scan_options``.
        base: a plan whose rules decide first.
        candidates, min_scheme: the schemes the solver may choose, the least one it may.
        method: the calibrated method the plan's rules record (``gptq``, ``awq``).

    Returns:
        ``(MixedPlan, SensitivityResult)``: ``mixed.plan`` goes to ``quantize_model``.

    Raises:
        LowbitError: a budget that is neither a number nor a preset, both or neither of budget
            and size, a scan file that is not one, a budget below the cheapest plan.
    """
    if (budget is None) == (size is None):
        raise LowbitError("give --budget or --size, one of them")
    ckpt = open_model(model)
    tensors = checkpoint_tensors(ckpt)
    if sensitivity_result is None:
        result = scan(ckpt, schemes, **scan_options)
    elif isinstance(sensitivity_result, SensitivityResult):
        result = sensitivity_result
    else:  # bounded size and depth, regular files only
        result = SensitivityResult.from_dict(_json.load(sensitivity_result))
    bpw = None
    if budget is not None:
        if budget in PRESETS:
            applied = preset_plan(str(budget), tensors).apply(tensors)
            bpw = applied.totals()["bits_per_weight"]
        else:
            try:
                bpw = float(budget)
            except ValueError:
                raise LowbitError(
                    f"--budget {budget!r}: a number of bits per weight (4.5) or a preset "
                    f"({', '.join(PRESETS)})"
                ) from None
    if base is not None and not isinstance(base, PrecisionPlan):
        base = PrecisionPlan.from_file(base)
    mixed = plan_for_budget(
        result, tensors, bits_per_weight=bpw, size=size, base=base, candidates=candidates,
        min_scheme=min_scheme, method=method,
    )  # fmt: skip
    return mixed, result
