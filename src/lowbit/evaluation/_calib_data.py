"""Calibration data for a sensitivity scan, disjoint from what ``lowbit eval`` measures.

- Causal LMs: ``samples`` consecutive windows of ``length`` tokens (tokenized as ``lowbit eval``
  tokenizes: no BOS). From the default text (CPython's ``pydoc_data.topics``) they start at
  token :data:`DEFAULT_START` = 32,768; ``lowbit eval`` scores the first ``--tokens`` (4,096 by
  default), so the two never share a token. A text file starts at token 0.
- Encoders: ``samples`` sentences cut as ``lowbit eval`` cuts its own
  (``sentences_from_text``), drawn with ``seed`` from those the evaluation does *not* measure
  (its 256 sentences of seed 0).

This is the same rule as the calibration data of calibrated quantization (GPTQ); the two are
meant to become one module.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from lowbit.errors import LowbitError
from lowbit.evaluation._compare import DEFAULT_SENTENCES
from lowbit.evaluation.perplexity import load_text, sentences_from_text, tokenize
from lowbit.evaluation.sensitivity import Calibration

__all__ = ["DEFAULT_LENGTH", "DEFAULT_SAMPLES", "DEFAULT_START", "calibration_data", "is_causal"]

#: First token of the default text used for calibration (evaluation scores tokens before it).
DEFAULT_START = 32_768
#: Windows (causal LMs) or sentences (encoders), and tokens per window.
DEFAULT_SAMPLES = {"causal": 8, "encoder": 128}
DEFAULT_LENGTH = 512

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'`])")


def is_causal(checkpoint: Any) -> bool:
    """Whether a checkpoint is a causal LM (a GGUF file, or a ``*ForCausalLM`` /
    ``*LMHeadModel`` architecture in its config)."""
    if checkpoint.format == "gguf":
        return True
    archs = (checkpoint.config or {}).get("architectures") or ()
    return any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs)


def _candidates(text: str) -> list[str]:
    """Every sentence ``sentences_from_text`` may draw from, in text order (its rule)."""
    seen: set[str] = set()
    out = []
    for para in re.split(r"\n\s*\n", text):
        flat = " ".join(para.split())
        for s in _SENTENCE_END.split(flat):
            letters = sum(c.isalpha() for c in s)
            if 30 <= len(s) <= 300 and letters >= 0.6 * len(s) and s not in seen:
                seen.add(s)
                out.append(s)
    return out


def calibration_data(
    kind: str,
    tokenizer: Any,
    source: str | Path | None = None,
    *,
    samples: int | None = None,
    length: int = DEFAULT_LENGTH,
    seed: int = 1,
) -> Calibration:
    """Calibration windows or sentences for a scan (see the module docstring).

    Args:
        kind: ``causal`` or ``encoder``.
        tokenizer: the model's tokenizer (causal LMs).
        source: ``None``/``"default"`` for the default text, or a UTF-8 text file.
        samples: windows or sentences (default :data:`DEFAULT_SAMPLES`).
        length: tokens per window.
        seed: the draw of encoder sentences.

    Returns:
        A :class:`~lowbit.evaluation.sensitivity.Calibration` whose label says what it is.

    Raises:
        LowbitError: bad sizes, a text too short for the windows or sentences asked for.
    """
    if kind not in DEFAULT_SAMPLES:
        raise LowbitError(f"kind must be 'causal' or 'encoder', got {kind!r}")
    n = DEFAULT_SAMPLES[kind] if samples is None else samples
    if n < 1 or length < 2:
        raise LowbitError(f"calibration needs samples >= 1 and length >= 2, got {n}, {length}")
    default = source is None or str(source).strip().lower() == "default"
    label, text = load_text(None if default else source)
    if kind == "causal":
        ids = tokenize(tokenizer, text)
        start = DEFAULT_START if default else 0
        if len(ids) < start + n * length:
            raise LowbitError(
                f"calibration: {label} has {len(ids):,} tokens, not enough for {n} windows of "
                f"{length} from token {start:,}"
            )
        windows = tuple(
            tuple(int(t) for t in ids[start + i * length : start + (i + 1) * length])
            for i in range(n)
        )
        return Calibration(
            f"{n} x {length} tokens of {label} from token {start:,}", windows=windows
        )
    measured = set(sentences_from_text(text, DEFAULT_SENTENCES, seed=0)) if default else set()
    pool = [s for s in _candidates(text) if s not in measured]
    if len(pool) < n:
        raise LowbitError(f"calibration: {label} has {len(pool)} usable sentences, fewer than {n}")
    pick = np.sort(np.random.default_rng(seed).choice(len(pool), size=n, replace=False))
    what = "outside the evaluation's" if default else "of the text"
    return Calibration(
        f"{n} sentences {what} of {label} (seed {seed})",
        sentences=tuple(pool[i] for i in pick),
    )
