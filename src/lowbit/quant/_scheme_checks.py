"""The checks ``lowbit.quant.scheme.Scheme`` runs on its fields: scale formats, enums, and the
served layouts' fields (NVFP4's two-level scales, the MX scale rules, tiles)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum
from typing import Any

from lowbit.errors import LowbitError
from lowbit.formats.catalog import format as _lookup

__all__ = [
    "DEFAULT_TILE",
    "MX_SCALE_RULES",
    "SCALE_FORMATS",
    "canonical_scale_format",
    "check_rule",
    "check_tile",
    "check_two_level",
    "require",
    "tile_grid",
]  # fmt: skip

#: Formats a scale may be stored in (canonical names).
SCALE_FORMATS = ("float32", "float16", "bfloat16", "float8_e8m0fnu", "float8_e4m3fn")

#: How an MX block's E8M0 scale is chosen from its largest magnitude ``amax`` (``X0`` is
#: OCP's ``2**(floor(log2 amax) - emax_elem)``): ``floor`` OCP MX v1.0 §6.3 (``X0``; values
#: above the element maximum saturate); ``carry`` round-up-on-carry (``2*X0`` when
#: ``amax/X0`` rounded to the element's precision would exceed its maximum, else ``X0``);
#: ``ceil`` the smallest power of two with ``amax/X <= max`` (NVIDIA's RCEIL: nothing clips;
#: also MLX 0.32's mxfp4/mxfp8 rule, ``2**ceil(log2(amax/max))``: ``lowbit.quant.mlx``);
#: ``ct`` compressed-tensors 0.20's ``generate_mx_scales`` (amax rounded half-up to 1
#: mantissa bit, 3 for E2M3, then floored; defined for mxfp4, mxfp6_e2m3, mxfp8_e4m3).
MX_SCALE_RULES = ("floor", "carry", "ceil", "ct")

#: Tile granularity's default block: DeepSeek-V3's and compressed-tensors' FP8_BLOCK weights.
DEFAULT_TILE = (128, 128)


def tile_grid(shape: Sequence[int], block_shape: tuple[int, int]) -> tuple[int, int]:
    """``(ceil(rows / bh), ceil(cols / bw))``: the tiles over a tensor (1-D: one row; more
    than 2-D: every axis but the last counts as rows)."""
    shape = tuple(int(s) for s in shape)
    cols = shape[-1] if shape else 1
    rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
    return -(-rows // block_shape[0]), -(-cols // block_shape[1])


def check_tile(
    bs: Any, gran: str, axis: Any, group_size: Any, name: str, mx: bool
) -> tuple[int, int] | None:
    """The block shape a scheme of granularity ``gran`` keeps (``DEFAULT_TILE`` for tiles
    without one; None for others).

    Raises:
        LowbitError: a malformed block shape, tiles with an axis or group size, tiles of MX or
            NF4 formats, a block shape without tile granularity.
    """
    if gran != "tile":
        if bs is not None:
            raise LowbitError(
                f"block_shape goes with tile granularity (e.g. fp8_e4m3:b128x128), not {gran}"
            )
        return None
    bs = DEFAULT_TILE if bs is None else bs
    if (
        not isinstance(bs, (tuple, list))
        or len(bs) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in bs)
    ):
        raise LowbitError(f"block_shape must be two positive integers (rows, columns), got {bs!r}")
    if axis is not None or group_size is not None:
        raise LowbitError("tile granularity takes block_shape, not axis or group_size")
    if mx or name == "nf4":
        raise LowbitError(f"{name} has its own blocks; tiles are for int and float formats")
    return (int(bs[0]), int(bs[1]))


def check_rule(rule: Any, name: str, mx: bool) -> str | None:
    """The MX scale rule a scheme keeps (``floor`` by default for MX formats, None for others).

    Raises:
        LowbitError: an unknown rule, a rule on a non-MX format, ``ct`` where
            compressed-tensors does not define it.
    """
    if rule is not None:
        shown, rule = rule, str(rule).strip().lower()
        if rule not in MX_SCALE_RULES:
            raise LowbitError(
                f"unknown MX scale rule {shown!r}; allowed: {', '.join(MX_SCALE_RULES)}"
            )
        if not mx:
            raise LowbitError(
                f"scale_rule {rule!r} chooses MX blocks' E8M0 scales; {name} is not an MX format"
            )
    if not mx:
        return None
    rule = rule or "floor"
    if rule == "ct" and name not in ("mxfp4", "mxfp6_e2m3", "mxfp8_e4m3"):
        raise LowbitError(
            f"compressed-tensors' scale rule is defined for mxfp4, mxfp6_e2m3 and mxfp8_e4m3, "
            f"not {name}; use floor, carry or ceil"
        )
    return rule


def check_two_level(tensor_scale: bool, scale_format: str, ok: dict[str, bool]) -> None:
    """E4M3 scales need a tensor scale over them, and a tensor scale needs NVFP4's layout
    (``ok``: each requirement and whether the scheme meets it).

    Raises:
        LowbitError: naming what is wrong.
    """
    if scale_format == "float8_e4m3fn" and not tensor_scale:
        raise LowbitError(
            "scales cannot be stored in float8_e4m3fn without a float32 tensor scale over them "
            "(add ts, as nvfp4 = fp4:g16:e4m3:ts does); scale formats: fp32, fp16, bf16, e8m0"
        )
    if tensor_scale:
        require(ok, "tensor_scale is NVFP4's two-level scaling: a float format in groups with "
                "float8_e4m3fn (e4m3) group scales, absmax, nearest rounding (write nvfp4 or "
                "fp4:g16:e4m3:ts)")  # fmt: skip


def require(ok: dict[str, bool], what: str) -> None:
    """Raise ``what; wrong: <the keys of ok that are False>`` unless every one holds.

    Raises:
        LowbitError: one line naming the requirements the scheme misses.
    """
    bad = [k for k, v in ok.items() if not v]
    if bad:
        raise LowbitError(f"{what}; wrong: {', '.join(bad)}")


def _enum(cls: type[Enum], value: Any, what: str) -> Any:
    if isinstance(value, cls):
        return value
    try:
        return cls(str(value).strip().lower())
    except ValueError:
        allowed = ", ".join(m.value for m in cls)  # type: ignore[attr-defined]
        raise LowbitError(f"unknown {what} {value!r}; allowed: {allowed}") from None


def canonical_scale_format(name: str) -> str:
    """Canonical name of a scale format (aliases such as ``fp16``, ``bf16``, ``e8m0``).

    Raises:
        LowbitError: a format scales cannot be stored in (the message lists the allowed ones).
    """
    try:
        canon = _lookup(name).name
    except LowbitError:
        canon = str(name)
    if canon not in SCALE_FORMATS:
        raise LowbitError(
            f"unsupported scale format {name!r}; allowed: float32, float16, bfloat16, e8m0, e4m3"
        )
    return canon
