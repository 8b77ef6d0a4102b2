"""What a GGUF can hold: the checks a plan passes before any work (GGML block types, rows of whole
blocks, names llama.cpp knows).
"""

from __future__ import annotations

import warnings
from typing import Any

from lowbit.errors import LowbitError
from lowbit.plans.plan import AppliedPlan
from lowbit.quant.scheme import Granularity

GGUF_Q = {4: "Q4_0", 8: "Q8_0"}


def _gguf_exact(s: Any) -> bool:
    """Whether a scheme is exactly a GGUF Q4_0/Q8_0 block layout."""
    fmt = s.element_format
    return (
        fmt.kind == "int"
        and getattr(fmt, "signed", False)
        and fmt.bits in GGUF_Q
        and s.symmetric
        and s.granularity is Granularity.GROUP
        and s.group_size == 32
        and s.axis in (-1, 1)
        and s.scale_format == "float16"
        and not s.restricted_range
    )


def check_gguf(
    applied: AppliedPlan, checkpoint: Any, rounding: str, source_check: Any = None
) -> None:
    """Refuse what GGUF cannot hold (each tensor's scheme first), then run ``source_check``
    (a Hugging Face source's family and tokenizer), then warn of llama.cpp's own rounding."""
    if checkpoint.format not in ("gguf", "huggingface", "safetensors"):
        raise LowbitError(
            f"{checkpoint.path}: GGUF output takes a GGUF or Hugging Face source; this source "
            f"is {checkpoint.format}. Write --out-format lowbit or compressed-tensors"
        )
    approx = []
    for t in applied.quantized:
        s = t.scheme
        fmt = s.element_format  # type: ignore[union-attr]
        if fmt.kind != "int" or fmt.bits not in GGUF_Q:
            raise LowbitError(
                f"tensor {t.name!r} as {t.label}: lowbit writes GGUF Q8_0 and Q4_0 (int8 / int4); "
                f"use --to q8_0 or q4_0, or --out-format lowbit for {fmt.name}"
            )
        if t.shape[-1] % 32:
            raise LowbitError(
                f"tensor {t.name!r} (shape {t.shape}): GGUF {GGUF_Q[fmt.bits]} needs rows that "
                f"are a multiple of 32"
            )
        if rounding == "auto" and not _gguf_exact(s):
            approx.append(t)
    if source_check is not None:
        source_check(checkpoint)
    if approx:
        labels = sorted({t.label for t in approx})
        warnings.warn(
            f"GGUF holds int4/int8 only as Q4_0/Q8_0 (groups of 32, float16 scales, symmetric): "
            f"{len(approx)} tensors planned as {', '.join(labels)} are quantized with llama.cpp's "
            f"own Q4_0/Q8_0 rounding instead",
            UserWarning,
            stacklevel=3,
        )
