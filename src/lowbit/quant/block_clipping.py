"""What each FP4 scale rule costs a tensor: how many scale blocks clip, how many block scales
underflow and how many values flush to zero (the report's per-tensor table, issue 26 item 5).

A block-scaled FP4 tensor stores E2M1 codes and one scale per block of ``b`` values along the
input axis (32 with an E8M0 scale for MXFP4, 16 with an E4M3 scale for NVFP4). The scale is
rounded to its format, and the rule that rounds it decides what the block loses:

- **clipped**: the block's largest magnitude ``amax`` is above the largest E2M1 value (6) times
  the stored scale, so it saturates. OCP's ``floor`` rule clips whenever ``amax / 2**floor(log2
  amax)`` is above 1.5 (6 = 1.5·4); ``carry`` and compressed-tensors' ``ct`` only between 1.5
  and 1.75 (where the saturated value is what rounding to E2M1 gives anyway: ``amax/X`` in
  (6, 7) rounds to 6); ``ceil`` (NVIDIA's RCEIL) never.
  NVFP4's E4M3 scales round to nearest, so a block whose scale rounds down clips by up to half
  an E4M3 step.
- **scale underflow**: a nonzero block whose scale is below the smallest the scale format
  holds (E8M0's 2**-127; E4M3's smallest subnormal 2**-9): it is stored larger than wanted (or
  as 0.125, compressed-tensors' stand-in for a zero NVFP4 scale) and most of the block flushes.
  Without NVFP4's tensor scale every block of a weight with values around 0.01 is near there.
- **flushed**: nonzero values that round to code 0 (``|x| <= scale · 0.25``: 0.25 is half the
  smallest E2M1 magnitude and a tie rounds to the even code 0).

Every count is of exact arithmetic on the float32 block maxima the quantizer computes (the
scales are those :func:`lowbit.quantize` stores, through the same functions).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from lowbit.errors import LowbitError
from lowbit.formats.catalog import format as lookup
from lowbit.formats.catalog import mx_format
from lowbit.formats.mx import E8M0_MIN_EXP
from lowbit.quant._choose import effective_scale, own_tensor_scale, two_level_scales
from lowbit.quant._range import _bump, mx_scales
from lowbit.quant.scheme import Granularity, Scheme
from lowbit.quant.scheme_text import parse_scheme

__all__ = ["FP4_SCALE_RULES", "NO_TENSOR_SCALE", "BlockCounts", "block_counts", "fp4_block_counts"]

#: NVFP4's layout without its float32 tensor scale (E4M3 block scales of ``amax / 6``): not a
#: scheme lowbit writes, only counted here, to show what the tensor scale saves.
NO_TENSOR_SCALE = "nvfp4 without tensor scale"

#: The rules :func:`fp4_block_counts` compares: MXFP4 under each E8M0 rule, NVFP4 with and
#: without its tensor scale.
FP4_SCALE_RULES = ("mxfp4", "mxfp4:carry", "mxfp4:ceil", "mxfp4:ct", "nvfp4", NO_TENSOR_SCALE)


@dataclass(frozen=True)
class BlockCounts:
    """One scale rule's cost on one tensor (see the module docstring).

    Attributes:
        rule: the rule as asked (``mxfp4:ct``, ``nvfp4``, :data:`NO_TENSOR_SCALE`).
        block: values per scale block.
        blocks, nonzero_blocks: scale blocks in the tensor, and those with a nonzero value.
        clipped: blocks whose largest magnitude saturates.
        scale_underflow: nonzero blocks whose scale is below the scale format's smallest.
        values, nonzero_values: values in the tensor, and the nonzero ones.
        flushed: nonzero values that round to zero.
    """

    rule: str
    block: int
    blocks: int
    nonzero_blocks: int
    clipped: int
    scale_underflow: int
    values: int
    nonzero_values: int
    flushed: int

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-able dict."""
        return asdict(self)

    def __add__(self, other: BlockCounts) -> BlockCounts:
        """The counts of two tensors under the same rule, summed.

        Raises:
            LowbitError: counts of different rules.
        """
        if (self.rule, self.block) != (other.rule, other.block):
            raise LowbitError(f"cannot add counts of {self.rule} and {other.rule}")
        return BlockCounts(
            self.rule, self.block,
            *(getattr(self, f) + getattr(other, f) for f in _COUNTED),
        )  # fmt: skip


_COUNTED = ("blocks", "nonzero_blocks", "clipped", "scale_underflow", "values",
            "nonzero_values", "flushed")  # fmt: skip


def _scheme(rule: str) -> Scheme:
    spec = "nvfp4" if rule == NO_TENSOR_SCALE else rule
    scheme = parse_scheme(spec)
    fp4 = isinstance(scheme, Scheme) and scheme.element_format.name == "float4_e2m1fn"
    if not fp4 or scheme.granularity not in (Granularity.GROUP, Granularity.BLOCK):
        raise LowbitError(
            f"{rule!r} is not a block-scaled FP4 rule; allowed: {', '.join(FP4_SCALE_RULES)} "
            "or another mxfp4/nvfp4 scheme string"
        )
    return scheme  # type: ignore[return-value]


def block_counts(x: Any, rule: str) -> BlockCounts:
    """Count the clipped blocks, underflowing scales and flushed values of ``x`` under one FP4
    scale rule (blocks along the last axis, as lowbit's weight layout).

    Args:
        x: the tensor (any float array; its last axis a multiple of the block).
        rule: an MXFP4/NVFP4 scheme string (``mxfp4``, ``mxfp4:carry``, ``mxfp4:ceil``,
            ``mxfp4:ct``, ``nvfp4``) or :data:`NO_TENSOR_SCALE`.

    Raises:
        LowbitError: another scheme, a last axis the block does not divide, non-finite values.
    """
    scheme = _scheme(rule)
    b = int(scheme.group_size)  # type: ignore[arg-type]
    a = np.asarray(x, dtype=np.float32)
    if a.ndim == 0 or a.shape[-1] % b:
        raise LowbitError(
            f"{rule}: blocks of {b} do not divide the last axis of a tensor of shape "
            f"{list(a.shape)}"
        )
    if not np.isfinite(a).all():
        raise LowbitError(f"{rule}: the tensor has non-finite values; blocks cannot be counted")
    v = np.abs(a.reshape(-1, b)).astype(np.float64)
    amax = v.max(axis=1)
    elem = scheme.element_format
    top, half = float(elem.max), float(elem.smallest_positive) / 2
    if scheme.is_mx:
        mxf = mx_format(scheme.format)
        scale = mx_scales(amax, scheme).astype(np.float64)
        _, e = np.frexp(amax)
        raw = e.astype(np.int64) - 1 - mxf.emax_elem
        if (scheme.scale_rule or "floor") != "floor":
            raw = raw + _bump(amax, raw, mxf, scheme.scale_rule)
        under = (amax > 0) & (raw < E8M0_MIN_EXP)
    else:
        sf = lookup(scheme.scale_format)
        per = (amax.astype(np.float32) / np.float32(top)).astype(np.float32)
        if rule == NO_TENSOR_SCALE:
            s = sf.decode(sf.encode(per, saturate=True), dtype=np.float32)
            s = np.where((s == 0) & (per > 0), np.float32(sf.smallest_positive), s)
            scale = s.astype(np.float64)
            wanted = per
        else:
            g = own_tensor_scale(a, scheme)
            scale = effective_scale(two_level_scales(amax, g, scheme), g).astype(np.float64)
            wanted = (per * np.float32(g)).astype(np.float32)
        under = (amax > 0) & (wanted < np.float32(sf.smallest_positive))
    nz = v > 0
    flushed = nz & (v <= half * scale[:, None])
    return BlockCounts(
        rule=rule,
        block=b,
        blocks=int(amax.size),
        nonzero_blocks=int(np.count_nonzero(amax > 0)),
        clipped=int(np.count_nonzero(amax > top * scale)),
        scale_underflow=int(np.count_nonzero(under)),
        values=int(v.size),
        nonzero_values=int(np.count_nonzero(nz)),
        flushed=int(np.count_nonzero(flushed)),
    )


def fp4_block_counts(x: Any, rules: Sequence[str] = FP4_SCALE_RULES) -> list[BlockCounts]:
    """:func:`block_counts` of ``x`` under each rule whose block divides its last axis (the
    others are left out).

    Raises:
        LowbitError: a rule that is not a block-scaled FP4 one; non-finite values.
    """
    out = []
    width = int(np.shape(x)[-1]) if np.ndim(x) else 0
    for rule in rules:
        b = int(_scheme(rule).group_size)  # type: ignore[arg-type]
        if width and width % b == 0:
            out.append(block_counts(x, rule))
    return out
