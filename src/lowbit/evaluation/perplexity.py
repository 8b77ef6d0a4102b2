"""Measure the quality a model keeps: perplexity and KL for causal LMs, embedding fidelity for encoders.

- :func:`perplexity`: a causal LM over a text in fixed windows (default 512 tokens, non-overlapping,
  no BOS, float32), optionally against a reference model in the same pass: mean KL divergence of
  the next-token distributions, KL(reference || model) as llama.cpp's ``--kl-divergence`` reports
  it, and how often both models agree on the most likely token.
- :func:`embedding_fidelity`: sentence embeddings (mean over the attention mask, L2-normalised,
  as sentence-transformers' all-MiniLM-L6-v2 pools) of a model against a reference: mean and
  minimum cosine similarity, and nearest-neighbour agreement.
- The text, its tokens and sentences come from ``lowbit.calibration.text`` (re-exported here).

Activation quantization (W8A8) is simulated with ``lowbit.models.activations.simulate_activations``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from lowbit._progress import progress_bar
from lowbit.calibration.text import (
    candidate_sentences,
    default_text,
    load_text,
    sentences_from_text,
    tokenize,
)
from lowbit.errors import LowbitError
from lowbit.models._compute import compute_context
from lowbit.models._threads import _threads, default_threads

__all__ = [
    "DEFAULT_BATCH",
    "MAX_LOGITS_BYTES",
    "batch_size",
    "candidate_sentences",
    "default_text",
    "default_threads",
    "embed",
    "embedding_fidelity",
    "load_text",
    "perplexity",
    "sentences_from_text",
    "tokenize",
]

# Windows per forward of a causal LM, and the float32 logits one forward may hold (1 GiB: ten
# 512-token windows of SmolLM2's 49,152-token vocabulary). Measured in docs/benchmarks.md.
DEFAULT_BATCH = 1
MAX_LOGITS_BYTES = 1 << 30


def _windows(n: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, first scored position) of each window over ``n`` tokens.

    A window scores the positions after its first token that no earlier window scored, so
    each position is scored at most once and always with context.
    """
    out = []
    scored_to = 1  # position 0 has no context
    for begin in range(0, max(n - 1, 0), stride):
        end = min(begin + window, n)
        first = max(scored_to, begin + 1)
        if first < end:
            out.append((begin, end, first))
            scored_to = end
        if end == n:
            break
    return out


def perplexity(
    model: Any,
    tokenizer: Any,
    text: str | None = None,
    *,
    label: str | None = None,
    window: int = 512,
    stride: int | None = None,
    max_tokens: int | None = 16_384,
    reference: Any = None,
    threads: int | None = None,
    progress: bool | None = None,
    batch: int = DEFAULT_BATCH,
    max_logits_bytes: int = MAX_LOGITS_BYTES,
    compute: str = "fp32",
) -> dict[str, Any]:
    """Perplexity of a causal LM over a text, and its KL divergence from a reference model.

    The text is tokenized without BOS and cut to ``max_tokens``; windows of ``window`` tokens
    start every ``stride`` tokens, and each window scores only positions no earlier window
    scored (with ``stride == window``, the default, windows do not overlap and each predicts
    ``window - 1`` tokens). Logits are float32 as the model computes them.

    Args:
        model: a causal LM (``model(input_ids=...).logits``), e.g. from ``lowbit.load_model``.
        tokenizer: its tokenizer.
        text: the text (default: :func:`default_text`).
        label: how to name the text in the result (default: "pydoc_data.topics (Python x.y.z)"
            for the default text, else "text").
        window: tokens per window (context length).
        stride: tokens between window starts (default: ``window``).
        max_tokens: use only the first this many tokens (``None``: all).
        reference: a second model with the same vocabulary; adds ``kl_mean`` (mean over scored
            tokens of KL(reference || model), in nats), ``kl_max``, ``top1_agreement`` (fraction
            of positions where both argmaxes agree) and ``reference_perplexity``. Its
            log-probabilities are computed window by window in the same pass.
        threads: torch threads (default: ``default_threads()``); restored afterwards.
        progress: tqdm bar (``None``: only on a terminal; ``False``: never).
        batch: windows of the same length that go through a model in one forward, at most
            (see :func:`batch_size`); per-window results are summed in window order either
            way, so only the forward's own rounding can differ between batch sizes.
        max_logits_bytes: fewer windows per forward where their float32 logits (of the model
            and of the reference together) would take more than this.
        compute: precision of the models' matrix products, ``fp32`` (default), ``bf16`` or
            ``auto`` (``lowbit.models._compute``); the result's ``compute`` says which ran.

    Returns:
        A dict: text, text_tokens (in the whole text), tokens (used), scored, window, stride,
        windows, bos (False), dtype, batch (windows per forward used), compute, perplexity, nll (mean,
        nats), seconds, tokens_per_second, and with a reference the KL entries above.

    Raises:
        LowbitError: window < 2, stride outside [1, window], fewer than 2 tokens, a batch
            below 1, or a reference whose vocabulary size differs.
    """
    import torch

    label, stride, ids, text_tokens, spans = _tokens_and_windows(
        tokenizer, text, label, window, stride, max_tokens
    )
    models = 1 if reference is None else 2
    size = batch_size(model, window, batch, max_logits_bytes, models=models)
    tokens = torch.tensor(ids, dtype=torch.long)
    nll_sum = 0.0
    ref_nll_sum = 0.0
    kl_sum = 0.0
    kl_max = 0.0
    agree = 0
    scored = 0
    start = time.perf_counter()
    bar = progress_bar(len(ids), progress, "perplexity", "tok")
    with _threads(threads), compute_context(compute) as used, torch.inference_mode(), bar:
        for group in _batches(spans, size):
            logps = _batch_log_probs(model, tokens, group)
            refs = [None] * len(group)
            if reference is not None:
                refs = _batch_log_probs(reference, tokens, group)
            for (_, end, first), logp, ref in zip(group, logps, refs, strict=True):
                target = tokens[first:end]
                nll = -logp.gather(1, target.unsqueeze(1)).squeeze(1)
                nll_sum += float(nll.double().sum())
                if ref is not None:
                    if ref.shape != logp.shape:
                        raise LowbitError(
                            f"reference vocabulary ({ref.shape[-1]}) differs from the model's "
                            f"({logp.shape[-1]})"
                        )
                    ref_nll_sum += float(-ref.gather(1, target.unsqueeze(1)).double().sum())
                    kl = (ref.exp() * (ref - logp)).sum(dim=-1)
                    kl_sum += float(kl.double().sum())
                    kl_max = max(kl_max, float(kl.max()))
                    agree += int((ref.argmax(-1) == logp.argmax(-1)).sum())
                scored += end - first
                bar.update(end - bar.n)
            del logps, refs
    seconds = time.perf_counter() - start
    result: dict[str, Any] = {
        **_window_facts(label, text_tokens, len(ids), scored, window, stride, spans, model),
        "batch": size,
        "compute": used,
        "perplexity": math.exp(nll_sum / scored),
        "nll": nll_sum / scored,
        "seconds": seconds,
        "tokens_per_second": len(ids) / seconds if seconds > 0 else float("inf"),
    }
    if reference is not None:
        result.update(
            reference_perplexity=math.exp(ref_nll_sum / scored),
            kl_mean=kl_sum / scored,
            kl_max=kl_max,
            top1_agreement=agree / scored,
        )
    return result


def _window_facts(
    label: str | None,
    text_tokens: int,
    tokens: int,
    scored: int,
    window: int,
    stride: int,
    spans: list[Any],
    model: Any,
) -> dict[str, Any]:
    """What a sliding-window perplexity run measured over (text, windows, dtype), as its
    result reports it."""
    return {
        "text": label or "text",
        "text_tokens": text_tokens,
        "tokens": tokens,
        "scored": scored,
        "window": window,
        "stride": stride,
        "windows": len(spans),
        "bos": False,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
    }


def batch_size(
    model: Any,
    window: int,
    batch: int = DEFAULT_BATCH,
    max_logits_bytes: int = MAX_LOGITS_BYTES,
    *,
    models: int = 1,
) -> int:
    """Windows per forward: ``batch``, or fewer where ``models`` batches of float32 logits
    (``batch × window × vocabulary × 4`` bytes each) would pass ``max_logits_bytes``; at
    least 1. A model whose vocabulary cannot be read (no output embeddings, no
    ``config.vocab_size``) runs one window at a time.

    Args:
        model: the causal LM (its output embeddings' rows, else ``config.vocab_size``, give
            the vocabulary).
        window: tokens per window.
        batch: the most windows per forward (a positive integer).
        max_logits_bytes: the bytes of logits held at once.
        models: how many models' logits of one batch are held together (2 when a reference
            runs over the same windows).

    Returns:
        The windows per forward.

    Raises:
        LowbitError: ``batch`` or ``max_logits_bytes`` not a positive integer.
    """
    _check_positive("batch", batch)
    _check_positive("max_logits_bytes", max_logits_bytes)
    vocab = _vocabulary(model)
    if vocab is None:
        return 1
    per_window = window * vocab * 4 * models
    return int(max(1, min(batch, max_logits_bytes // per_window)))


def _check_positive(name: str, value: Any) -> None:
    """Raise LowbitError unless ``value`` is an integer >= 1 (not a bool, not a float)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise LowbitError(f"{name} must be a positive integer, got {value!r}")


def _vocabulary(model: Any) -> int | None:
    """The width of the model's logits, or None where the model does not say."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    weight = getattr(head, "weight", None)
    if weight is not None and len(weight.shape) == 2:
        return int(weight.shape[0])
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    return int(vocab) if isinstance(vocab, int) and vocab > 0 else None


def _batches(spans: Sequence[tuple[int, int, int]], size: int) -> list[list[tuple[int, int, int]]]:
    """Consecutive windows of the same length, at most ``size`` per group (the last, shorter
    window of a text goes on its own)."""
    groups: list[list[tuple[int, int, int]]] = []
    for span in spans:
        last = groups[-1] if groups else None
        if last and len(last) < size and last[0][1] - last[0][0] == span[1] - span[0]:
            last.append(span)
        else:
            groups.append([span])
    return groups


def _batch_log_probs(model: Any, tokens: Any, group: Sequence[tuple[int, int, int]]) -> Any:
    """One forward over the windows of ``group`` (all of one length); returns an iterator of
    each window's float32 log-probabilities predicting its positions ``first .. end-1``.

    The forward runs now (inside whatever context the caller holds, e.g. simulated
    activations); the log-softmax runs one window at a time as the iterator is read, so
    at most one window's log-probabilities exist beside the batch's logits.
    """
    import torch

    inp = torch.stack([tokens[begin:end] for begin, end, _ in group])
    logits = model(input_ids=inp, use_cache=False).logits
    return (
        torch.log_softmax(logits[i, first - begin - 1 : -1].float(), dim=-1)
        for i, (begin, _, first) in enumerate(group)
    )


# ----------------------------------------------------------------------------- encoders


def embed(
    model: Any,
    tokenizer: Any,
    sentences: Sequence[str],
    *,
    batch_size: int = 32,
    max_length: int = 256,
    threads: int | None = None,
    progress: bool | None = None,
    compute: str = "fp32",
) -> np.ndarray:
    """Sentence embeddings: last hidden state averaged over the attention mask, L2-normalised.

    This is all-MiniLM-L6-v2's pooling (its ``1_Pooling/config.json``: mean tokens; then the
    ``Normalize`` module); ``max_length`` 256 is its ``max_seq_length``. ``compute`` is
    the precision of the model's matrix products (``fp32``, ``bf16``, ``auto``).

    Returns:
        float32 array ``[len(sentences), hidden]`` of unit vectors.
    """
    import torch

    out = []
    bar = progress_bar(len(sentences), progress, "embedding", "sent")
    with _threads(threads), compute_context(compute), torch.inference_mode(), bar:
        for i in range(0, len(sentences), batch_size):
            out.append(_embed_batch(model, tokenizer, sentences[i : i + batch_size], max_length))
            bar.update(len(sentences[i : i + batch_size]))
    return np.concatenate(out).astype(np.float32)


def _embed_batch(model: Any, tokenizer: Any, batch: Sequence[str], max_length: int) -> Any:
    import torch

    enc = tokenizer(
        list(batch), padding=True, truncation=True, max_length=max_length, return_tensors="pt"
    )
    hidden = model(**enc).last_hidden_state.float()
    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2, dim=1).numpy()


def embedding_fidelity(
    model: Any,
    reference: Any,
    tokenizer: Any,
    sentences: Sequence[str] | None = None,
    *,
    n: int = 256,
    seed: int = 0,
    text: str | None = None,
    label: str | None = None,
    batch_size: int = 32,
    threads: int | None = None,
    progress: bool | None = None,
) -> dict[str, Any]:
    """How closely a (quantized) encoder's sentence embeddings follow a reference's.

    Args:
        model: the encoder under test (``model(**enc).last_hidden_state``).
        reference: the original encoder.
        tokenizer: their tokenizer.
        sentences: the sentences (default: ``n`` drawn from ``text`` with ``seed``).
        n, seed: how many sentences to draw, and from which seed.
        text: where to draw them from (default: :func:`default_text`).
        label: how to name the text in the result.

    Returns:
        A dict: text, sentences (count), seed, mean_cosine, min_cosine (between each sentence's
        two embeddings), nn_agreement (fraction of sentences whose nearest other sentence is
        the same under both models), seconds.
    """
    start = time.perf_counter()
    sentences, label = _fidelity_sentences(sentences, text, label, n, seed)
    kw = {"batch_size": batch_size, "threads": threads, "progress": progress}
    a = embed(model, tokenizer, sentences, **kw)
    b = embed(reference, tokenizer, sentences, **kw)
    cos = np.sum(a.astype(np.float64) * b, axis=1)
    return {
        "text": label or ("sentences" if text is None else "text"),
        "sentences": len(sentences),
        "seed": seed,
        "mean_cosine": float(cos.mean()),
        "min_cosine": float(cos.min()),
        "nn_agreement": float(np.mean(_nearest(a) == _nearest(b))),
        "seconds": time.perf_counter() - start,
    }


def _nearest(e: np.ndarray) -> np.ndarray:
    sim = e.astype(np.float64) @ e.T.astype(np.float64)
    np.fill_diagonal(sim, -np.inf)
    return np.argmax(sim, axis=1)


def _tokens_and_windows(
    tokenizer: Any,
    text: str | None,
    label: str | None,
    window: int,
    stride: int | None,
    max_tokens: int | None,
) -> tuple[str | None, int, list[int], int, list[tuple[int, int, int]]]:
    """Check window/stride, tokenize the text (default: pydoc_data.topics), cut the windows.

    Returns (label, stride, ids, tokens in the whole text, window spans).
    """
    if window < 2:
        raise LowbitError(f"window must be at least 2 tokens, got {window}")
    stride = window if stride is None else stride
    if not 1 <= stride <= window:
        raise LowbitError(f"stride must be between 1 and the window ({window}), got {stride}")
    if text is None:
        default_label, text = default_text()
        label = label or default_label
    ids = tokenize(tokenizer, text)
    text_tokens = len(ids)
    if max_tokens is not None:
        ids = ids[:max_tokens]
    if len(ids) < 2:
        raise LowbitError(f"the text gives {len(ids)} tokens; perplexity needs at least 2")
    return label, stride, ids, text_tokens, _windows(len(ids), window, stride)


def _fidelity_sentences(
    sentences: Sequence[str] | None, text: str | None, label: str | None, n: int, seed: int
) -> tuple[Sequence[str], str | None]:
    """The sentences to embed: the caller's (at least 2), or ``n`` drawn from the text
    (default: pydoc_data.topics). Returns (sentences, label)."""
    if sentences is None:
        if text is None:
            default_label, text = default_text()
            label = label or default_label
        return sentences_from_text(text, n, seed=seed), label
    if len(sentences) < 2:
        raise LowbitError("embedding fidelity needs at least 2 sentences")
    return sentences, label
