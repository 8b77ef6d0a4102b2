"""Measuring variants against the original in one pass: :class:`Variant`, :func:`compare_causal`
(perplexity, KL, top-1 agreement of causal LMs), :func:`compare_encoder` (embedding fidelity of
encoders). The numbers are those of :mod:`lowbit.evaluation.perplexity`, with the original's
outputs computed once for every variant.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lowbit._progress import progress_bar
from lowbit.calibration.text import DEFAULT_SENTENCES, DEFAULT_TOKENS
from lowbit.errors import LowbitError
from lowbit.evaluation.act_modes import (
    ACT_MODES,
    KV_MODES,
    LLAMACPP,
    act_mode,
    calibrate_input_scales,
    simulate_act_mode,
    simulate_kv_cache,
    simulate_llamacpp_activations,
    simulate_stored_activations,
)
from lowbit.evaluation.perplexity import (
    DEFAULT_BATCH,
    MAX_LOGITS_BYTES,
    _batch_log_probs,
    _batches,
    _fidelity_sentences,
    _nearest,
    _tokens_and_windows,
    _window_facts,
    batch_size,
    embed,
)
from lowbit.models._compute import compute_context, resolve_compute
from lowbit.models._threads import _threads
from lowbit.models.activations import simulate_activations
from lowbit.plans.rules import activation_format

__all__ = ["DEFAULT_SENTENCES", "DEFAULT_TOKENS", "Variant", "compare_causal", "compare_encoder"]


@dataclass
class Variant:
    """One model to measure against the original.

    Attributes:
        name: the row label (``original``, a scheme string, a folder name).
        format: what it is, in words (``int4 g128``, ``Q4_1 GGUF``).
        model: the torch model.
        activations: per-token activation format simulated on every linear layer's input
            during measurement (``int8`` for W8A8 rows), or None.
        bits_per_weight: stored bits per weight of the quantized tensors, scales included.
        nbytes: tensor data bytes.
        source: ``disk`` or ``memory``.
    """

    name: str
    format: str
    model: Any
    activations: str | None = None
    bits_per_weight: float | None = None
    nbytes: int | None = None
    source: str = "memory"
    extra: dict[str, Any] = field(default_factory=dict)
    act_calibration: Any = None  # NVFP4 activations: token windows for the static input scales
    #: a folder's own input quantization, emulated as served: ``{layer: (mode, scale)}``
    #: (``CompressedTensorsFolder.input_activations``); ``activations`` simulates on top
    stored_activations: Any = None

    def row(self) -> dict[str, Any]:
        stored = sorted({m for m, _ in (self.stored_activations or {}).values()})
        own = "+".join(stored) + " (stored)" if stored else None
        return {
            "name": self.name,
            "format": self.format,
            "activations": self.activations or own,
            "bits_per_weight": self.bits_per_weight,
            "bytes": self.nbytes,
            "size_source": self.source,
            **self.extra,
        }


def _act_context(model: Any, fmt: str | None, calibration: Any = None, stored: Any = None) -> Any:
    """The simulation ``fmt`` names: a per-token format (``int8``, ``float8_e4m3fn``), an
    ``lowbit eval --act`` mode, ``kv:MODE``, or several joined by ``+``; with ``stored``, a
    folder's own input quantization (:func:`simulate_stored_activations`) first."""
    if fmt is None and not stored:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    if stored:
        stack.enter_context(simulate_stored_activations(model, stored))
    parts = fmt.split("+") if fmt else []
    for part in parts:
        if part.startswith("kv:"):
            stack.enter_context(simulate_kv_cache(model, part[3:]))
        elif part == LLAMACPP:
            kv = any(p.startswith("kv:") for p in parts)  # a --kv cache replaces its F16 one
            stack.enter_context(simulate_llamacpp_activations(model, cache=not kv))
        elif part in ACT_MODES and part != "int8":
            scales = None
            if part == "nvfp4" and calibration:
                scales = calibrate_input_scales(model, calibration)
            stack.enter_context(simulate_act_mode(model, part, global_scales=scales))
        else:
            stack.enter_context(simulate_activations(model, part))
    return stack


def _with_activations(
    make: Callable[[], Variant], act: str | None, calibration: Any = None
) -> list[Variant]:
    """The variant ``make`` builds, and with ``act`` its twin measured with simulated
    activations (per token, an ``--act`` mode and/or a ``kv:`` cache; the same model)."""
    v = make()
    if act is None:
        return [v]
    # a folder's own input quantization stays under a KV-cache-only simulation; an --act or
    # --w8a8 mode replaces it (the twin is the folder's weights with the asked activations)
    kv_only = all(p.startswith("kv:") for p in act.split("+"))
    stored = v.stored_activations if kv_only else None
    plain = (
        "+" not in act
        and not act.startswith("kv:")
        and act != LLAMACPP
        and (act == "int8" or act not in ACT_MODES)
    )
    twin = Variant(
        name=f"{v.name} + {act} act" if plain else f"{v.name} + {act}",
        format=f"{v.format}, {act} per-token activations" if plain else f"{v.format}, {act}",
        model=v.model,
        activations=act,
        bits_per_weight=v.bits_per_weight,
        nbytes=v.nbytes,
        source=v.source,
        act_calibration=calibration,
        stored_activations=stored,
    )
    if v.stored_activations and not kv_only:
        twin.format += " in place of its stored activations"
    return [v, twin]


def _act_spec(w8a8: str | None, act: str | None, kv: str | None) -> str | None:
    """The simulation every twin row runs: ``w8a8``'s per-token format or an ``--act`` mode,
    and ``kv:MODE``, joined by ``+`` (None: no twin rows)."""
    if w8a8 and act:
        raise LowbitError("--act and --w8a8 both choose the activations: give one")
    parts = [activation_format(w8a8)] if w8a8 else []
    if act and str(act).strip().lower() in (LLAMACPP, "llama.cpp"):
        parts.append(LLAMACPP)
    elif act:
        parts.append(act_mode(act))
    if kv:
        if str(kv).strip().lower() not in KV_MODES:
            raise LowbitError(f"unknown KV-cache mode {kv!r}; allowed: {', '.join(KV_MODES)}")
        parts.append(f"kv:{str(kv).strip().lower()}")
    return "+".join(p for p in parts if p) or None


# ---------------------------------------------------------------------------------------
# Causal LMs
# ---------------------------------------------------------------------------------------


def compare_causal(
    variants: Sequence[Variant],
    reference: Any,
    tokenizer: Any,
    text: str | None = None,
    *,
    label: str | None = None,
    window: int = 512,
    stride: int | None = None,
    max_tokens: int | None = DEFAULT_TOKENS,
    threads: int | None = None,
    progress: bool | None = None,
    batch: int = DEFAULT_BATCH,
    max_logits_bytes: int = MAX_LOGITS_BYTES,
    compute: str = "fp32",
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Perplexity, KL and top-1 agreement of every variant against ``reference``, in one pass.

    Windows, scoring and arithmetic are those of ``lowbit.evaluation.perplexity.perplexity`` (which gives the
    same numbers one model at a time): the text is tokenized without BOS and cut to
    ``max_tokens``; a window of ``window`` tokens starts every ``stride`` tokens and scores the
    positions no earlier window scored; KL is KL(reference || variant) in nats, averaged over
    scored tokens. A variant whose model *is* the reference (with no activation simulation)
    reuses the reference's log-probabilities.

    The reference runs once per window; its float32 log-probabilities go to an anonymous
    temporary file (``scored × vocabulary × 4`` bytes of disk, not memory) and are read back
    window by window for each variant, so memory does not grow with ``max_tokens``.

    ``batch`` windows of the same length go through a model in one forward (fewer where
    their float32 logits would pass ``max_logits_bytes``: see
    ``lowbit.evaluation.perplexity.batch_size``); each window's log-probabilities are still
    taken and summed one window at a time, in window order.

    ``compute`` is the precision of the models' matrix products: ``fp32`` (default),
    ``bf16`` or ``auto`` (``lowbit.models._compute``).

    Returns:
        ``(measured, rows)``: what was measured (text, text_tokens, tokens, scored, window,
        stride, windows, bos, dtype, batch, threads, compute, seconds), and per variant a dict with
        perplexity, nll, kl_mean, kl_max, top1_agreement, seconds.

    Raises:
        LowbitError: as ``lowbit.evaluation.perplexity.perplexity`` (window, stride, too few tokens,
            batch, vocabularies that differ).
    """
    groups = [(lambda v=v: [v]) for v in variants]
    measured, pairs = _compare_causal_groups(
        groups, len(variants), reference, tokenizer, text, label=label, window=window,
        stride=stride, max_tokens=max_tokens, threads=threads, progress=progress,
        batch=batch, max_logits_bytes=max_logits_bytes, compute=compute,
    )  # fmt: skip
    return measured, [row for _, row in pairs]


def _compare_causal_groups(
    groups: Sequence[Callable[[], Sequence[Variant]]],
    count: int,
    reference: Any,
    tokenizer: Any,
    text: str | None,
    *,
    label: str | None,
    window: int,
    stride: int | None,
    max_tokens: int | None,
    threads: int | None,
    progress: bool | None,
    batch: int = DEFAULT_BATCH,
    max_logits_bytes: int = MAX_LOGITS_BYTES,
    compute: str = "fp32",
) -> tuple[dict[str, Any], list[tuple[dict[str, Any], dict[str, Any]]]]:
    """:func:`compare_causal` over variants built one group at a time.

    Each group is a callable that builds variants sharing one model (a scheme's model and its
    W8A8 twin); the group is measured over every window and released before the next one is
    built, so at most the reference and one variant model are alive (``lowbit eval``'s
    memory). ``count`` is the number of variants in all groups (for the progress bar).

    Returns:
        ``(measured, [(variant.row(), row), ...])`` in group order (no variant is kept, so
        its model is freed once its group is measured).
    """
    import torch

    label, stride, ids, text_tokens, spans = _tokens_and_windows(
        tokenizer, text, label, window, stride, max_tokens
    )
    size = batch_size(reference, window, batch, max_logits_bytes)
    batches = _batches(spans, size)
    tokens = torch.tensor(ids, dtype=torch.long)
    scored = sum(end - first for _, end, first in spans)
    ref_secs = 0.0
    out: list[tuple[dict[str, Any], dict[str, Any]]] = []
    start = time.perf_counter()
    bar = progress_bar(len(ids) * (count + 1), progress, "evaluating", "tok")
    with bar, tempfile.TemporaryFile() as cache:
        shapes = []
        with _threads(threads) as used_threads, compute_context(compute), torch.inference_mode():
            for group in batches:
                t0 = time.perf_counter()
                refs = _batch_log_probs(reference, tokens, group)
                ref_secs += time.perf_counter() - t0
                for begin, end, _ in group:
                    t0 = time.perf_counter()
                    ref = next(refs)  # the window's log-softmax
                    ref_secs += time.perf_counter() - t0
                    cache.write(ref.contiguous().numpy().data)
                    shapes.append(tuple(ref.shape))
                    bar.update(end - begin)
                del refs, ref
        for make in groups:
            # built outside the measuring contexts, as when every variant was built up front
            for v in make():
                with _threads(threads), compute_context(compute), torch.inference_mode():
                    row = _measure_causal(v, reference, tokens, batches, shapes, cache, bar)
                out.append((v.row(), row))
                del v
    measured = {
        "kind": "causal-lm",
        **_window_facts(label, text_tokens, len(ids), scored, window, stride, spans, reference),
        "batch": size,
        "threads": used_threads,
        "compute": resolve_compute(compute),
        "seconds": time.perf_counter() - start,
        "reference_seconds": ref_secs,
    }
    return measured, out


def _measure_causal(
    v: Variant,
    reference: Any,
    tokens: Any,
    batches: Sequence[Sequence[tuple[int, int, int]]],
    shapes: Sequence[tuple[int, ...]],
    cache: Any,
    bar: Any,
) -> dict[str, Any]:
    """One variant over every window, a batch of windows per forward, against the reference
    log-probabilities in ``cache`` (float32, window after window). The sums run window by
    window in the same order as ``perplexity``'s, so with the same batches the numbers are
    the same bit for bit."""
    import torch

    nll = kl = kl_max = 0.0
    agree = scored = 0
    secs = 0.0
    cache.seek(0)
    shape_of = iter(shapes)
    same = v.model is reference and v.activations is None and not v.stored_activations
    for group in batches:
        t0 = time.perf_counter()
        if same:
            logps = iter([None] * len(group))
        else:
            with _act_context(v.model, v.activations, v.act_calibration, v.stored_activations):
                logps = _batch_log_probs(v.model, tokens, group)
        secs += time.perf_counter() - t0
        for begin, end, first in group:
            ref = torch.empty(next(shape_of), dtype=torch.float32)
            if cache.readinto(ref.numpy().data) != ref.numel() * 4:  # internal invariant
                raise AssertionError("short read of the reference log-probabilities")
            target = tokens[first:end].unsqueeze(1)
            t0 = time.perf_counter()
            logp = next(logps)  # the window's log-softmax (None: the reference's own)
            logp = ref if logp is None else logp
            if logp.shape != ref.shape:
                raise LowbitError(
                    f"{v.name}: vocabulary ({logp.shape[-1]}) differs from the original's "
                    f"({ref.shape[-1]})"
                )
            nll += float(-logp.gather(1, target).squeeze(1).double().sum())
            k = (ref.exp() * (ref - logp)).sum(dim=-1)
            kl += float(k.double().sum())
            kl_max = max(kl_max, float(k.max()))
            agree += int((ref.argmax(-1) == logp.argmax(-1)).sum())
            secs += time.perf_counter() - t0
            scored += end - first
            bar.update(end - begin)
        del logps
    return {
        "perplexity": math.exp(nll / scored),
        "nll": nll / scored,
        "kl_mean": kl / scored,
        "kl_max": kl_max,
        "top1_agreement": agree / scored,
        "seconds": secs,
    }


# ---------------------------------------------------------------------------------------
# Encoders
# ---------------------------------------------------------------------------------------


def compare_encoder(
    variants: Sequence[Variant],
    reference: Any,
    tokenizer: Any,
    sentences: Sequence[str] | None = None,
    *,
    n: int = DEFAULT_SENTENCES,
    seed: int = 0,
    text: str | None = None,
    label: str | None = None,
    batch_size: int = 32,
    threads: int | None = None,
    progress: bool | None = None,
    compute: str = "fp32",
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Embedding fidelity of every variant against ``reference`` (embedded once).

    The measures are ``lowbit.evaluation.perplexity.embedding_fidelity``'s: cosine similarity of each
    sentence's two embeddings (mean and minimum), and the fraction of sentences whose nearest
    other sentence is the same under both models.

    Returns:
        ``(measured, rows)``; rows hold mean_cosine, min_cosine, nn_agreement, seconds.
    """
    groups = [(lambda v=v: [v]) for v in variants]
    measured, pairs = _compare_encoder_groups(
        groups, reference, tokenizer, sentences, n=n, seed=seed, text=text, label=label,
        batch_size=batch_size, threads=threads, progress=progress, compute=compute,
    )  # fmt: skip
    return measured, [row for _, row in pairs]


def _compare_encoder_groups(
    groups: Sequence[Callable[[], Sequence[Variant]]],
    reference: Any,
    tokenizer: Any,
    sentences: Sequence[str] | None,
    *,
    n: int,
    seed: int,
    text: str | None,
    label: str | None,
    batch_size: int,
    threads: int | None,
    progress: bool | None,
    compute: str = "fp32",
) -> tuple[dict[str, Any], list[tuple[dict[str, Any], dict[str, Any]]]]:
    """:func:`compare_encoder` over variants built one group at a time (each group released
    before the next is built, as in :func:`_compare_causal_groups`)."""
    start = time.perf_counter()
    sentences, label = _fidelity_sentences(sentences, text, label, n, seed)
    kw = {"batch_size": batch_size, "threads": threads, "progress": progress, "compute": compute}
    ref = embed(reference, tokenizer, sentences, **kw)
    ref_nn = _nearest(ref)
    out: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for make in groups:
        for v in make():
            t0 = time.perf_counter()
            if v.model is reference and v.activations is None and not v.stored_activations:
                a = ref
            else:
                with _act_context(v.model, v.activations, v.act_calibration, v.stored_activations):
                    a = embed(v.model, tokenizer, sentences, **kw)
            cos = np.sum(a.astype(np.float64) * ref, axis=1)
            row = {
                "mean_cosine": float(cos.mean()),
                "min_cosine": float(cos.min()),
                "nn_agreement": float(np.mean(_nearest(a) == ref_nn)),
                "seconds": time.perf_counter() - t0,
            }
            out.append((v.row(), row))
            del v
    measured = {
        "kind": "encoder",
        "text": label or ("sentences" if text is None else "text"),
        "sentences": len(sentences),
        "seed": seed,
        "pooling": "mean over the attention mask, L2-normalised (max 256 tokens)",
        "compute": resolve_compute(compute),
        "seconds": time.perf_counter() - start,
    }
    return measured, out
