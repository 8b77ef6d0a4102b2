"""Measuring variants against the original in one pass: :class:`Variant`, :func:`compare_causal`
(perplexity, KL, top-1 agreement of causal LMs), :func:`compare_encoder` (embedding fidelity of
encoders). The numbers are those of :mod:`lowbit.evaluation.perplexity`, with the original's
outputs computed once for every variant.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lowbit._progress import progress_bar
from lowbit.errors import LowbitError
from lowbit.evaluation._threads import _threads
from lowbit.evaluation.activations import simulate_activations
from lowbit.evaluation.perplexity import (
    _fidelity_sentences,
    _log_probs,
    _nearest,
    _tokens_and_windows,
    _window_facts,
    embed,
)

__all__ = ["DEFAULT_SENTENCES", "DEFAULT_TOKENS", "Variant", "compare_causal", "compare_encoder"]

DEFAULT_TOKENS = 4096
DEFAULT_SENTENCES = 256


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

    def row(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "format": self.format,
            "activations": self.activations,
            "bits_per_weight": self.bits_per_weight,
            "bytes": self.nbytes,
            "size_source": self.source,
            **self.extra,
        }


def _act_context(model: Any, fmt: str | None) -> Any:
    if fmt is None:
        return contextlib.nullcontext()
    return simulate_activations(model, fmt)


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
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Perplexity, KL and top-1 agreement of every variant against ``reference``, in one pass.

    Windows, scoring and arithmetic are those of ``lowbit.evaluation.perplexity.perplexity`` (which gives the
    same numbers one model at a time): the text is tokenized without BOS and cut to
    ``max_tokens``; a window of ``window`` tokens starts every ``stride`` tokens and scores the
    positions no earlier window scored; KL is KL(reference || variant) in nats, averaged over
    scored tokens. A variant whose model *is* the reference (with no activation simulation)
    reuses the reference's log-probabilities.

    Returns:
        ``(measured, rows)``: what was measured (text, text_tokens, tokens, scored, window,
        stride, windows, bos, dtype, threads, seconds), and per variant a dict with
        perplexity, nll, kl_mean, kl_max, top1_agreement, seconds.

    Raises:
        LowbitError: as ``lowbit.evaluation.perplexity.perplexity`` (window, stride, too few tokens,
            vocabularies that differ).
    """
    import torch

    label, stride, ids, text_tokens, spans = _tokens_and_windows(
        tokenizer, text, label, window, stride, max_tokens
    )
    tokens = torch.tensor(ids, dtype=torch.long)
    n = len(variants)
    nll = [0.0] * n
    kl = [0.0] * n
    kl_max = [0.0] * n
    agree = [0] * n
    secs = [0.0] * n
    ref_secs = 0.0
    scored = 0
    start = time.perf_counter()
    bar = progress_bar(len(ids) * (n + 1), progress, "evaluating", "tok")
    with _threads(threads) as used_threads, torch.inference_mode(), bar:
        for begin, end, first in spans:
            inp = tokens[begin:end].unsqueeze(0)
            target = tokens[first:end].unsqueeze(1)
            t0 = time.perf_counter()
            ref = _log_probs(reference, inp, first - begin)
            ref_secs += time.perf_counter() - t0
            ref_argmax = ref.argmax(-1)
            ref_p = ref.exp()
            bar.update(end - begin)
            for i, v in enumerate(variants):
                t0 = time.perf_counter()
                if v.model is reference and v.activations is None:
                    logp = ref
                else:
                    with _act_context(v.model, v.activations):
                        logp = _log_probs(v.model, inp, first - begin)
                if logp.shape != ref.shape:
                    raise LowbitError(
                        f"{v.name}: vocabulary ({logp.shape[-1]}) differs from the original's "
                        f"({ref.shape[-1]})"
                    )
                nll[i] += float(-logp.gather(1, target).squeeze(1).double().sum())
                k = (ref_p * (ref - logp)).sum(dim=-1)
                kl[i] += float(k.double().sum())
                kl_max[i] = max(kl_max[i], float(k.max()))
                agree[i] += int((ref_argmax == logp.argmax(-1)).sum())
                secs[i] += time.perf_counter() - t0
                bar.update(end - begin)
            scored += end - first
    measured = {
        "kind": "causal-lm",
        **_window_facts(label, text_tokens, len(ids), scored, window, stride, spans, reference),
        "threads": used_threads,
        "seconds": time.perf_counter() - start,
        "reference_seconds": ref_secs,
    }
    rows = []
    for i in range(n):
        rows.append(
            {
                "perplexity": math.exp(nll[i] / scored),
                "nll": nll[i] / scored,
                "kl_mean": kl[i] / scored,
                "kl_max": kl_max[i],
                "top1_agreement": agree[i] / scored,
                "seconds": secs[i],
            }
        )
    return measured, rows


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
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Embedding fidelity of every variant against ``reference`` (embedded once).

    The measures are ``lowbit.evaluation.perplexity.embedding_fidelity``'s: cosine similarity of each
    sentence's two embeddings (mean and minimum), and the fraction of sentences whose nearest
    other sentence is the same under both models.

    Returns:
        ``(measured, rows)``; rows hold mean_cosine, min_cosine, nn_agreement, seconds.
    """
    start = time.perf_counter()
    sentences, label = _fidelity_sentences(sentences, text, label, n, seed)
    kw = {"batch_size": batch_size, "threads": threads, "progress": progress}
    ref = embed(reference, tokenizer, sentences, **kw)
    ref_nn = _nearest(ref)
    rows = []
    for v in variants:
        t0 = time.perf_counter()
        if v.model is reference and v.activations is None:
            a = ref
        else:
            with _act_context(v.model, v.activations):
                a = embed(v.model, tokenizer, sentences, **kw)
        cos = np.sum(a.astype(np.float64) * ref, axis=1)
        rows.append(
            {
                "mean_cosine": float(cos.mean()),
                "min_cosine": float(cos.min()),
                "nn_agreement": float(np.mean(_nearest(a) == ref_nn)),
                "seconds": time.perf_counter() - t0,
            }
        )
    measured = {
        "kind": "encoder",
        "text": label or ("sentences" if text is None else "text"),
        "sentences": len(sentences),
        "seed": seed,
        "pooling": "mean over the attention mask, L2-normalised (max 256 tokens)",
        "seconds": time.perf_counter() - start,
    }
    return measured, rows
