"""The text lowbit measures and calibrates on: the default text, its tokens and sentences, and the slice evaluation keeps.

- The default text is CPython's own ``pydoc_data.topics`` (the documentation ``help()`` shows),
  which every Python install has; its exact content differs between Python versions, so labels
  state the version.
- ``lowbit eval`` measures the first :data:`DEFAULT_TOKENS` tokens of a causal LM's text (more
  when asked) and :data:`DEFAULT_SENTENCES` sentences drawn with seed 0 for an encoder
  (:func:`evaluated_sentences`); calibration (``lowbit.calibration.data``) and sensitivity
  scans draw from the rest, so the two never share a token or a sentence.
"""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path
from typing import Any

import numpy as np

from lowbit.errors import LowbitError

__all__ = [
    "DEFAULT_SENTENCES",
    "DEFAULT_TOKENS",
    "candidate_sentences",
    "default_text",
    "evaluated_sentences",
    "load_text",
    "sentences_from_text",
    "tokenize",
]

DEFAULT_TOKENS = 4096  # tokens of a causal LM that ``lowbit eval`` measures by default
DEFAULT_SENTENCES = 256  # sentences of an encoder that ``lowbit eval`` measures by default


def default_text() -> tuple[str, str]:
    """CPython's ``pydoc_data.topics``, joined in sorted key order with blank lines.

    Returns:
        ``(label, text)``; the label names the Python version the text came with.
    """
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    return f"pydoc_data.topics (Python {platform.python_version()})", text


def load_text(path: str | os.PathLike[str] | None = None) -> tuple[str, str]:
    """``(label, text)`` of a UTF-8 text file, or the default text when ``path`` is None.

    Raises:
        LowbitError: the file cannot be read or is empty.
    """
    if path is None:
        return default_text()
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LowbitError(f"{p}: cannot read text ({exc})") from None
    if not text.strip():
        raise LowbitError(f"{p}: the text is empty")
    return str(p), text


def tokenize(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a whole text without special tokens (no BOS), never truncated or padded."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return list(tokenizer.encode(text, add_special_tokens=False))
    # the fast tokenizer itself, so transformers does not log "longer than the model"; its
    # truncation/padding settings (tokenizer.json may set them) are lifted for this call
    truncation, padding = backend.truncation, backend.padding
    backend.no_truncation()
    backend.no_padding()
    try:
        return list(backend.encode(text, add_special_tokens=False).ids)
    finally:
        if truncation is not None:
            backend.enable_truncation(**truncation)
        if padding is not None:
            backend.enable_padding(**padding)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'`])")


def candidate_sentences(text: str, *, min_chars: int = 30, max_chars: int = 300) -> list[str]:
    """Every distinct prose sentence of a text, in text order (what
    :func:`sentences_from_text` draws from; calibration draws from the ones it does not)."""
    seen: set[str] = set()
    candidates = []
    for para in re.split(r"\n\s*\n", text):
        flat = " ".join(para.split())
        for s in _SENTENCE_END.split(flat):
            letters = sum(c.isalpha() for c in s)
            if min_chars <= len(s) <= max_chars and letters >= 0.6 * len(s) and s not in seen:
                seen.add(s)
                candidates.append(s)
    return candidates


def sentences_from_text(
    text: str, n: int = 256, *, seed: int = 0, min_chars: int = 30, max_chars: int = 300
) -> list[str]:
    """Draw ``n`` distinct prose sentences from a text (deterministically for a seed).

    Paragraphs are split at blank lines, whitespace collapsed, and split into sentences after
    ``.``, ``!`` or ``?``; sentences of ``min_chars`` .. ``max_chars`` characters that contain
    mostly letters are candidates, and ``n`` are drawn without replacement, kept in text order.

    Raises:
        LowbitError: fewer than ``n`` candidates (or n < 2).
    """
    if n < 2:
        raise LowbitError(f"need at least 2 sentences, got n={n}")
    candidates = candidate_sentences(text, min_chars=min_chars, max_chars=max_chars)
    if len(candidates) < n:
        raise LowbitError(f"the text has {len(candidates)} usable sentences, fewer than n={n}")
    pick = np.sort(np.random.default_rng(seed).choice(len(candidates), size=n, replace=False))
    return [candidates[i] for i in pick]


def evaluated_sentences(text: str) -> list[str]:
    """The sentences ``lowbit eval`` measures an encoder on by default (:data:`DEFAULT_SENTENCES`
    drawn with seed 0), which calibration leaves out; none for a text too short for them."""
    try:
        return sentences_from_text(text, DEFAULT_SENTENCES, seed=0)
    except LowbitError:
        return []
