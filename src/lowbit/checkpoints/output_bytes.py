"""Each planned tensor's bytes in each output format (codes, scales, zero points, shapes), for the
size a plan promises before any work.
"""

from __future__ import annotations

from lowbit.checkpoints.gguf.checks import GGUF_Q
from lowbit.ggml import legacy
from lowbit.plans.plan import TensorPlan
from lowbit.quant.scheme import Granularity


def output_nbytes(t: TensorPlan, out_format: str = "lowbit") -> int:
    """Bytes a tensor takes in the chosen output format (codes, scales, zero points, shapes)."""
    if out_format == "lowbit" or t.action == "cast":
        return t.nbytes
    if t.action == "keep":
        if out_format == "gguf" or plain_dtype(t.dtype):
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


def plain_dtype(dtype: str) -> bool:
    return dtype in ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2") or dtype.startswith(
        ("I", "U", "BOOL")
    )
