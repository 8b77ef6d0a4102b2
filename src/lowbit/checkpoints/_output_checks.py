"""What each output format can hold: the checks a plan passes before any work (compressed-tensors, GGUF), and each tensor's bytes in that format."""

from __future__ import annotations

import warnings
from typing import Any

from lowbit.checkpoints.names import gguf_to_hf_name
from lowbit.errors import LowbitError
from lowbit.ggml import legacy
from lowbit.plans.plan import AppliedPlan, TensorPlan
from lowbit.quant.scheme import Granularity

GGUF_Q = {4: "Q4_0", 8: "Q8_0"}


def check_ct(applied: AppliedPlan, checkpoint: Any) -> None:
    for t in applied.quantized:
        s = t.scheme
        assert s is not None
        fmt = s.element_format
        why = None
        served = s.tensor_scale or s.format == "mxfp4" or s.granularity is Granularity.TILE
        if len(t.shape) != 2:
            why = "compressed-tensors stores 2-D weights [out, in]"
        elif served:
            why = _served_why(s, t.shape)
        elif fmt.kind == "int" and fmt.bits <= 8:
            if s.granularity is Granularity.CHANNEL and s.axis % 2 != 0:
                why = "channel scales must run along the output axis (axis 0)"
            elif s.granularity is Granularity.GROUP and (
                s.axis % 2 != 1 or t.shape[1] % int(s.group_size)  # type: ignore[arg-type]
            ):
                why = (
                    f"groups must run along the input axis and divide its length {t.shape[1]} "
                    f"(group {s.group_size}); try a group size that divides it"
                )
        elif fmt.name == "float8_e4m3fn" and s.symmetric:
            if s.granularity not in (Granularity.TENSOR, Granularity.CHANNEL) or (
                s.granularity is Granularity.CHANNEL and s.axis % 2 != 0
            ):
                why = "fp8 weights take per-tensor or per-output-channel scales"
        else:
            why = "compressed-tensors defines int1..int8 and fp8 (float8_e4m3fn) weights"
        if why is None and s.scale_format != "float32" and not served:
            why = "lowbit writes compressed-tensors scales as float32: use fp32 scales"
        if why is None and s.double_quant:
            why = "double quantization has no compressed-tensors layout"
        if why is None and t.activations == "nvfp4" and not s.tensor_scale:
            raise LowbitError(
                f"tensor {t.name!r} as {t.label}: NVFP4 activations (W4A4) go with NVFP4 "
                "weights in compressed-tensors: give --to nvfp4 (or a plan rule with format "
                "nvfp4), or per-token activations (--activations int8|fp8)"
            )
        if why is None and t.activations not in (None, "int8", "float8_e4m3fn", "nvfp4"):
            why = f"compressed-tensors declares int8, fp8 or nvfp4 activations, not {t.activations}"
        if why is not None:
            raise LowbitError(
                f"tensor {t.name!r} (shape {t.shape}) as {t.label}: {why} (or write "
                f"--out-format lowbit, which holds every scheme)"
            )
    if checkpoint.format == "gguf":
        for t in applied.tensors:
            gguf_to_hf_name(t.name, checkpoint.config)  # raises for ones with no counterpart


def _served_why(s: Any, shape: tuple[int, ...]) -> str | None:
    """What keeps an NVFP4 / MXFP4 / FP8-block weight from compressed-tensors (None: fits)."""
    cols = shape[1]
    if s.tensor_scale:
        if s.format != "float4_e2m1fn" or s.group_size != 16 or s.axis % 2 != 1:
            return "compressed-tensors' two-level scales are NVFP4's: fp4 in groups of 16 (nvfp4)"
        if cols % 16:
            return f"NVFP4 needs the input width to be a multiple of 16, got {cols}"
    elif s.format == "mxfp4":
        if cols % 32:
            return f"MXFP4 needs the input width to be a multiple of 32, got {cols}"
    elif s.format != "float8_e4m3fn":
        return "compressed-tensors stores blocks (tiles) of fp8 (float8_e4m3fn) weights"
    return None


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


def output_nbytes(t: TensorPlan, out_format: str = "lowbit") -> int:
    """Bytes a tensor takes in the chosen output format (codes, scales, zero points, shapes)."""
    if out_format == "lowbit" or t.action == "cast":
        return t.nbytes
    if t.action == "keep":
        if out_format == "gguf" or _plain_dtype(t.dtype):
            return t.source_nbytes  # copied as stored
        return t.numel * 2  # a GGUF block type: float16 or bfloat16 (kept_dense)
    s = t.scheme
    assert s is not None
    bits = s.element_format.bits
    if out_format == "gguf":
        return legacy.nbytes(t.shape, GGUF_Q[bits])
    rows, cols = t.shape
    if s.granularity is Granularity.TILE:  # FP8 blocks: fp8 values, a float32 scale per tile
        bh, bw = s.block_shape  # type: ignore[misc]
        return rows * cols + -(-rows // bh) * -(-cols // bw) * 4
    if s.tensor_scale or s.format == "mxfp4":  # NVFP4 / MXFP4: packed fp4, a byte per group
        group = 16 if s.tensor_scale else 32
        n = rows * -(-cols // 2) + rows * (cols // group)
        return n + (4 if s.tensor_scale else 0) + (4 if t.activations == "nvfp4" else 0)
    gran = s.granularity.value
    groups = 1 if gran in ("tensor", "channel") else -(-cols // int(s.group_size))  # type: ignore[arg-type]
    nscale = 1 if gran == "tensor" else rows * groups
    n = nscale * 4  # float32 scales
    if t.activations is not None or s.element_format.kind == "float":
        n += rows * cols  # int8 / fp8 weights, one byte each
        if not s.symmetric:
            n += nscale  # int8 zero points
    else:
        n += rows * -(-cols * bits // 32) * 4 + 16  # int32-packed rows + weight_shape
        if not s.symmetric:  # zero points packed down the rows (a per-tensor one stays int8)
            n += 1 if gran == "tensor" else -(-rows * bits // 32) * groups * 4
    return n


def _plain_dtype(dtype: str) -> bool:
    return dtype in ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2") or dtype.startswith(
        ("I", "U", "BOOL")
    )
