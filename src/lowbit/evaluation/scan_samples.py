"""A sensitivity scan's calibration samples, disjoint from what ``lowbit eval`` measures.

Token windows or sentences drawn by calibrated quantization's rules
(:func:`lowbit.calibration.data.decoder_windows` and
:func:`~lowbit.calibration.data.encoder_texts`) in the scan's own sizes
(:data:`SCAN_SAMPLES`: 8 windows of 512 tokens from token 32,768 of the default text, or 128
sentences drawn with seed 1 from those outside eval's 256).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lowbit.calibration.data import (
    DEFAULT_LENGTH,
    Calibration,
    decoder_windows,
    encoder_texts,
)
from lowbit.calibration.text import evaluated_sentences
from lowbit.errors import LowbitError

__all__ = ["SCAN_SAMPLES", "ScanSamples", "is_causal", "scan_samples"]

SCAN_SAMPLES = {"causal": 8, "encoder": 128}  # a sensitivity scan's windows or sentences


@dataclass(frozen=True)
class ScanSamples:
    """The data a sensitivity scan's trials run on: token windows (causal LMs) or sentences
    (encoders). (:class:`Calibration` says where data comes from; this is the data.)

    Attributes:
        label: where it came from, for reports (text, slice).
        windows: token id windows, each the same length (causal LMs).
        sentences: texts (encoders).
    """

    label: str
    windows: tuple[tuple[int, ...], ...] = ()
    sentences: tuple[str, ...] = ()


def is_causal(checkpoint: Any) -> bool:
    """Whether a checkpoint is a causal LM (a GGUF file, or a ``*ForCausalLM`` /
    ``*LMHeadModel`` architecture in its config)."""
    if checkpoint.format == "gguf":
        return True
    archs = (checkpoint.config or {}).get("architectures") or ()
    return any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs)


def scan_samples(
    kind: str,
    tokenizer: Any,
    source: str | Path | None = None,
    *,
    samples: int | None = None,
    length: int = DEFAULT_LENGTH,
    seed: int = 1,
) -> ScanSamples:
    """Calibration windows (:func:`decoder_windows`) or sentences (:func:`encoder_texts`,
    outside eval's 256 of seed 0) for a sensitivity scan, disjoint from what eval measures.

    Args:
        kind: ``causal`` or ``encoder``.
        tokenizer: the model's tokenizer (causal LMs).
        source: ``None``/``"default"`` for the default text, or a UTF-8 text file.
        samples: windows or sentences (default :data:`SCAN_SAMPLES`).
        length: tokens per window.
        seed: the draw of encoder sentences.

    Raises:
        LowbitError: bad sizes, a text too short for the windows or sentences asked for.
    """
    if kind not in SCAN_SAMPLES:
        raise LowbitError(f"kind must be 'causal' or 'encoder', got {kind!r}")
    n = SCAN_SAMPLES[kind] if samples is None else samples
    if n < 1 or length < 2:
        raise LowbitError(f"calibration needs samples >= 1 and length >= 2, got {n}, {length}")
    default = source is None or str(source).strip().lower() == "default"
    if not default and Path(source).suffix.lower() != ".txt":  # type: ignore[arg-type]
        raise LowbitError(f"calibration text {str(source)!r}: use 'default' or a .txt file")
    calib = Calibration(source="default" if default else str(source), samples=n,
                        length=length, seed=seed)  # fmt: skip
    label = calib.text()[0]
    if kind == "causal":
        with warnings.catch_warnings():  # too few windows is an error here, not a warning
            warnings.simplefilter("ignore", UserWarning)
            try:
                windows = decoder_windows(tokenizer, calib)
            except LowbitError:
                windows = []
        if len(windows) < n:
            raise LowbitError(
                f"calibration: {label} has too few tokens for {n} windows of {length} from "
                f"token {calib.first_token:,}"
            )
        return ScanSamples(
            f"{n} x {length} tokens of {label} from token {calib.first_token:,}",
            windows=tuple(tuple(int(t) for t in w) for w in windows),
        )
    text = calib.text()[1]
    measured = evaluated_sentences(text) if default else ()
    what = "outside the evaluation's" if default else "of the text"
    return ScanSamples(
        f"{n} sentences {what} of {label} (seed {seed})",
        sentences=tuple(encoder_texts(calib, exclude=measured)),
    )
