"""Calibration data for calibrated quantization (GPTQ, AWQ, SmoothQuant).

**Data** (:class:`Calibration`): ``default``, a UTF-8 ``.txt`` file or a ``.jsonl`` file (one
JSON string, or object with a ``"text"`` field, per line); or, from Python, texts (a list of
str), token windows (a 2-D integer numpy array, or a list of lists of token ids) or a
dataset-like iterable of str or of dicts with a ``"text"`` field (a Hugging Face ``Dataset``).
Texts and datasets are records, as a ``.jsonl`` file's; token windows are used as given (causal
LMs only), cut to ``length`` and ``samples``.

* Causal LMs: ``samples`` windows (default 128) of ``length`` tokens (default 512), tokenized
  without BOS as ``lowbit eval`` tokenizes, consecutive and non-overlapping from token ``start``
  on. For the default text (CPython's ``pydoc_data.topics``, as ``lowbit eval``) ``start`` is
  :data:`DEFAULT_START` = 32,768: evaluation scores the first ``--tokens`` tokens (4,096 by
  default, 16,384 for ``lowbit.evaluation.perplexity.perplexity``), so calibration and
  evaluation never share a token; when an evaluation asks for more tokens than that,
  ``lowbit eval`` starts calibration after them (:func:`decoder_windows`'s ``avoid``). SmolLM2's
  tokenizer gives 112,955 tokens of the text, room for the default 128 x 512 after 32,768. A
  ``.txt`` file starts at token 0; a ``.jsonl`` file gives one sample per record (at most
  ``length`` tokens each).
* Encoders: ``samples`` texts (default 256): sentences of the text cut as ``lowbit eval`` cuts
  its evaluation sentences (``sentences_from_text``), drawn (``seed``) from those the evaluation
  does *not* measure; a ``.jsonl`` file gives its records.

**Statistics** collected on it: :mod:`lowbit.calibration.hessians`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import numpy as np

from lowbit.calibration.text import candidate_sentences, load_text, tokenize
from lowbit.errors import LowbitError

__all__ = [
    "DEFAULT_LENGTH",
    "DEFAULT_SAMPLES_DECODER",
    "DEFAULT_SAMPLES_ENCODER",
    "DEFAULT_START",
    "Calibration",
    "decoder_windows",
    "encoder_texts",
]

#: First token of the default text that calibration uses (evaluation scores tokens before it).
DEFAULT_START = 32_768
DEFAULT_SAMPLES_DECODER = 128
DEFAULT_SAMPLES_ENCODER = 256
DEFAULT_LENGTH = 512

#: What :class:`Calibration`'s ``source`` takes: ``"default"``, a ``.txt``/``.jsonl`` path,
#: texts, token windows (lists of ids or a 2-D integer array) or a dataset-like iterable of str
#: or of dicts with a ``"text"`` field.
CalibrationSource = Union[str, "os.PathLike[str]", Iterable[Any]]


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """Where calibration data comes from, and how much of it.

    Args:
        source: ``"default"`` (the text ``lowbit eval`` uses), a ``.txt`` / ``.jsonl`` path,
            texts (a list of str; one str is a path), token windows (a list of lists of token
            ids, or a 2-D integer numpy array: causal LMs only), or a dataset-like iterable of
            str or dicts with a ``"text"`` field; in-memory data is read once, here, and
            ``source`` then holds its label (``"<32 texts>"``).
        samples: windows (causal LMs; default 128) or texts (encoders; default 256).
        length: tokens per window (causal LMs; default 512) or at most per text (encoders:
            default 256, all-MiniLM-L6-v2's maximum).
        start: first token of a text source used (default: :data:`DEFAULT_START` for the
            default text, 0 for a file).
        seed: the draw of encoder sentences.
        experts: mixtures of experts: ``all`` (default) runs every calibration token through
            every expert while collecting statistics (the block's output still sums only the
            routed experts), so each expert's layers see all tokens; ``routed``: each expert
            sees only the tokens its router sends it.
        expert_min_tokens: with ``routed``, an expert layer that saw fewer tokens is rounded
            to nearest instead (its GPTQ/AWQ statistics would rest on too few tokens); the run's
            ``layers`` report says so (``fallback``). Default 32.

    Raises:
        LowbitError: non-positive sizes, a negative start, a file that does not exist or is
            neither ``.txt`` nor ``.jsonl``, an unknown ``experts`` mode, in-memory data that
            is empty, mixes texts and tokens, or holds a record without a string ``"text"``
            or token ids that are not non-negative integers.
    """

    source: CalibrationSource = "default"
    samples: int | None = None
    length: int | None = None
    start: int | None = None
    seed: int = 0
    experts: str = "all"
    expert_min_tokens: int = 32
    _texts: tuple[str, ...] | None = field(default=None, init=False, repr=False)
    _tokens: tuple[tuple[int, ...], ...] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.source, (str, os.PathLike)):
            texts, tokens = _in_memory(self.source)
            object.__setattr__(self, "_texts", texts)
            object.__setattr__(self, "_tokens", tokens)
            label = (
                f"{len(texts)} texts" if texts is not None else f"{len(tokens or ())} token windows"
            )
            object.__setattr__(self, "source", f"<{label}>")
            self._check_sizes()
            return
        src = os.fspath(self.source) if not isinstance(self.source, str) else self.source
        if src.strip().lower() == "default":
            src = "default"
        else:
            p = Path(src)
            if p.suffix.lower() not in (".txt", ".jsonl"):
                raise LowbitError(
                    f"calibration data {src!r}: use 'default', a .txt file or a .jsonl file"
                )
            if not p.is_file():
                raise LowbitError(f"calibration data {src!r}: no such file")
        object.__setattr__(self, "source", src)
        self._check_sizes()

    def _check_sizes(self) -> None:
        for key in ("samples", "length"):
            v = getattr(self, key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise LowbitError(f"calibration {key} must be a positive integer, got {v!r}")
        if self.start is not None and (not isinstance(self.start, int) or self.start < 0):
            raise LowbitError(f"calibration start must be an integer >= 0, got {self.start!r}")
        mode = str(self.experts).strip().lower()
        if mode not in ("all", "routed"):
            raise LowbitError(
                f"calibration experts must be 'all' or 'routed', got {self.experts!r}"
            )
        object.__setattr__(self, "experts", mode)
        floor = self.expert_min_tokens
        if isinstance(floor, bool) or not isinstance(floor, int) or floor < 0:
            raise LowbitError(f"expert_min_tokens must be an integer >= 0, got {floor!r}")

    @property
    def is_default(self) -> bool:
        return self.source == "default"

    @property
    def is_jsonl(self) -> bool:
        return (
            self._texts is None and self._tokens is None and self.source.lower().endswith(".jsonl")
        )

    @property
    def is_records(self) -> bool:
        """Whether the data is separate samples (a ``.jsonl`` file, texts, a dataset, token
        windows) rather than one text cut into windows or sentences."""
        return self.is_jsonl or self._texts is not None or self._tokens is not None

    @property
    def tokens(self) -> tuple[tuple[int, ...], ...] | None:
        """The token windows given, or None for text data."""
        return self._tokens

    def text(self) -> tuple[str, str]:
        """``(label, text)`` of a text source (the default text or a ``.txt`` file).

        Raises:
            LowbitError: data given as records (texts, tokens, a ``.jsonl`` file).
        """
        if self.is_records:
            raise LowbitError(
                f"calibration data {self.source} is separate samples, not one text "
                "(give 'default' or a .txt file here)"
            )
        return load_text(None if self.is_default else self.source)

    def records(self) -> list[str]:
        """The texts of a ``.jsonl`` source, in file order.

        Raises:
            LowbitError: a line that is not JSON, or neither a string nor an object with a
                string ``"text"``.
        """
        if self._texts is not None:
            return list(self._texts)
        if self._tokens is not None:
            raise LowbitError(
                f"calibration data {self.source} is token ids, which calibrate causal LMs; "
                "give an encoder texts"
            )
        out = []
        try:
            lines = Path(self.source).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise LowbitError(f"{self.source}: cannot read ({exc})") from None
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise LowbitError(f"{self.source}:{i}: not JSON ({exc.msg})") from None
            text = rec.get("text") if isinstance(rec, dict) else rec
            if not isinstance(text, str):
                raise LowbitError(
                    f"{self.source}:{i}: a record must be a string or an object with a "
                    f'string "text"'
                )
            out.append(text)
        if not out:
            raise LowbitError(f"{self.source}: no records")
        return out

    def describe(self, kind: str) -> str:
        """In words, e.g. ``128 x 512 tokens of pydoc_data.topics from token 32,768``."""
        where = "the default text" if self.is_default else self.source
        if kind == "encoder":
            return f"{self.samples or DEFAULT_SAMPLES_ENCODER} texts of {where}"
        n = self.samples or DEFAULT_SAMPLES_DECODER
        L = self.length or DEFAULT_LENGTH
        if self.is_records:
            return f"{n} records of {where} (at most {L} tokens each)"
        return f"{n} x {L} tokens of {where} from token {self.first_token:,}"

    @property
    def first_token(self) -> int:
        if self.start is not None:
            return self.start
        return DEFAULT_START if self.is_default else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "samples": self.samples,
            "length": self.length,
            "start": self.start,
            "seed": self.seed,
            "experts": self.experts,
            "expert_min_tokens": self.expert_min_tokens,
        }


def _in_memory(data: Any) -> tuple[tuple[str, ...] | None, tuple[tuple[int, ...], ...] | None]:
    """``(texts, None)`` or ``(None, token windows)`` of calibration data given in memory.

    Raises:
        LowbitError: bytes, a mapping, no samples, an item that is neither a str, a dict with
            a string ``"text"`` nor a sequence of token ids, a mix of texts and tokens, token ids
            that are not non-negative integers.
    """
    if isinstance(data, (bytes, bytearray, Mapping)) or not isinstance(data, Iterable):
        raise LowbitError(
            f"calibration data must be 'default', a .txt/.jsonl path, texts, token windows or "
            f"a dataset of texts, got {type(data).__name__}"
        )
    if isinstance(data, np.ndarray):
        if data.dtype.kind not in "iu":
            raise LowbitError(f"calibration token ids must be integers, got dtype {data.dtype}")
        data = [data] if data.ndim == 1 else list(data)
    items = list(data)
    if not items:
        raise LowbitError("calibration data is empty")
    if all(isinstance(x, str) or isinstance(x, Mapping) for x in items):
        texts = []
        for i, x in enumerate(items):
            text = x.get("text") if isinstance(x, Mapping) else x
            if not isinstance(text, str):
                raise LowbitError(
                    f"calibration record {i}: a dict must have a string 'text' field "
                    f"(keys: {', '.join(map(str, list(x)[:8]))})"
                )
            texts.append(text)
        return tuple(texts), None
    windows = []
    for i, x in enumerate(items):
        if isinstance(x, (str, bytes, Mapping)) or not isinstance(x, Iterable):
            raise LowbitError(
                f"calibration sample {i} is {type(x).__name__}: give all texts (str or dicts "
                "with 'text') or all token windows (sequences of token ids)"
            )
        arr = np.asarray(list(x) if not isinstance(x, np.ndarray) else x)
        if arr.ndim != 1 or arr.size == 0:
            raise LowbitError(f"calibration window {i} must be a non-empty 1-D run of token ids")
        if arr.dtype.kind not in "iu" or (arr < 0).any():
            raise LowbitError(
                f"calibration window {i}: token ids must be non-negative integers, got "
                f"{arr.dtype} values such as {arr.reshape(-1)[0]!r}"
            )
        windows.append(tuple(int(t) for t in arr))
    return None, tuple(windows)


def decoder_windows(tokenizer: Any, calib: Calibration, *, avoid: int = 0) -> list[list[int]]:
    """Token windows of a causal LM's calibration data.

    Args:
        tokenizer: the model's tokenizer.
        calib: the data.
        avoid: a text source's first ``avoid`` tokens are what an evaluation scores: windows
            start at ``max(calib.first_token, avoid)`` (pass the evaluation's ``--tokens`` when
            calibration and evaluation read the same text).

    Returns:
        ``samples`` lists of token ids (``length`` each for a text; at most for records).

    Raises:
        LowbitError: a text too short for even one window.

    Warns:
        UserWarning: a text with room for fewer windows than asked (the ones there are used).
    """
    import warnings

    n = calib.samples or DEFAULT_SAMPLES_DECODER
    L = calib.length or DEFAULT_LENGTH
    if calib.tokens is not None:
        return [list(w[:L]) for w in calib.tokens[:n]]
    if calib.is_records:
        out = [ids[:L] for ids in (tokenize(tokenizer, r) for r in calib.records()) if ids]
        return out[:n]
    label, text = calib.text()
    ids = tokenize(tokenizer, text)
    start = max(calib.first_token, avoid)
    fit = max(0, (len(ids) - start) // L)
    if fit == 0:
        raise LowbitError(
            f"calibration: {label} has {len(ids):,} tokens, no room for a window of {L} after "
            f"token {start:,}"
        )
    if fit < n:
        warnings.warn(
            f"calibration: {label} has room for {fit} windows of {L} tokens after token "
            f"{start:,}, not {n}; using {fit}",
            UserWarning,
            stacklevel=2,
        )
    return [ids[start + i * L : start + (i + 1) * L] for i in range(min(n, fit))]


def encoder_texts(calib: Calibration, *, exclude: Collection[str] = ()) -> list[str]:
    """Texts of an encoder's calibration data.

    Sentences of a text source are cut as the evaluation cuts its own (``sentences_from_text``)
    and drawn with ``calib.seed`` from those not in ``exclude`` (the evaluation's sentences),
    kept in text order; records of a ``.jsonl`` source are taken in file order.

    Raises:
        LowbitError: fewer candidate sentences than ``samples``.
    """

    n = calib.samples or DEFAULT_SAMPLES_ENCODER
    if calib.is_records:
        return calib.records()[:n]
    label, text = calib.text()
    skip = set(exclude)
    pool = [s for s in candidate_sentences(text) if s not in skip]
    if len(pool) < n:
        raise LowbitError(
            f"calibration: {label} has {len(pool)} sentences outside the evaluation's, "
            f"fewer than {n}"
        )
    pick = np.sort(np.random.default_rng(calib.seed).choice(len(pool), size=n, replace=False))
    return [pool[i] for i in pick]


# ---------------------------------------------------------------------------------------
# Hessians
