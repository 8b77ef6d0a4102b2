"""What compressed-tensors can hold: the checks a plan passes before any work (schemes vLLM
serves, groups that fit the format).
"""

from __future__ import annotations

from typing import Any

from lowbit.checkpoints.gguf.names import gguf_to_hf_name
from lowbit.errors import LowbitError
from lowbit.plans.plan import AppliedPlan
from lowbit.quant.scheme import Granularity


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
