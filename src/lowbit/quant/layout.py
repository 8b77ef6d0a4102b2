"""Where the scales go: each granularity as 4-D views of the tensor.

Every granularity is handled as one or two 4-D views ``V`` of the (C-contiguous)
tensor with a scale array ``S`` that broadcasts against ``V``:

* tensor:  ``V = x.reshape(1, 1, N, 1)``, ``S`` shape ``(1, 1, 1, 1)``;
* channel along ``a``: ``V = x.reshape(P, C, 1, Q)``, ``S`` ``(1, C, 1, 1)``;
* group/block of ``G`` along ``a``: ``V = x.reshape(P, L//G, G, Q)``, ``S``
  ``(P, L//G, 1, Q)``, plus a second view ``(P, 1, L%G, Q)`` for a ragged last group;
* tiles of ``(bh, bw)``: handled apart (``lowbit.quant._tiles``), scale ``(ceil(R/bh),
  ceil(C/bw))`` for ``R`` rows and ``C`` columns (``(ceil(C/bw),)`` for 1-D), the layout of
  compressed-tensors' FP8 block scales;

where ``P`` and ``Q`` are the products of the dimensions before and after ``a``. The
stored scale keeps the tensor's rank: tensor ``(1,)*ndim``; channel ``C`` at ``a`` and
1 elsewhere; group: the tensor's shape with ``L`` replaced by ``ceil(L/G)`` (the layout
of compressed-tensors' group scales, ``[out, in/G]`` for a weight ``[out, in]``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lowbit._arrays import bfloat16
from lowbit.codecs.packing import packed_nbytes
from lowbit.errors import LowbitError
from lowbit.formats.catalog import format as lookup
from lowbit.formats.catalog import mx_format
from lowbit.formats.mx import e8m0_codes
from lowbit.quant.nf4 import DQ_BLOCK
from lowbit.quant.scheme import Granularity, Scheme, tile_grid

__all__ = [
    "REDUCE_CHANNEL",
    "REDUCE_GROUP",
    "ArraySpec",
    "Layout",
    "Part",
    "make_layout",
    "quantized_arrays",
]

REDUCE_GROUP = (2,)
REDUCE_CHANNEL = (0, 2, 3)


@dataclass(frozen=True)
class Part:
    """One 4-D view's geometry: which slice of axis ``a`` it covers and its group size."""

    start: int
    stop: int
    groups: int
    size: int


@dataclass(frozen=True)
class Layout:
    shape: tuple[int, ...]
    granularity: Granularity
    axis: int | None  # normalised, None for tensor
    group: int | None
    tiles: tuple[int, int] | None = None  # tile granularity's block shape

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def pqr(self) -> tuple[int, int, int]:
        """(P, L, Q): sizes before, along and after the axis."""
        if self.axis is None:
            return 1, self.numel, 1
        a = self.axis
        return math.prod(self.shape[:a]), self.shape[a], math.prod(self.shape[a + 1 :])

    @property
    def reduce_axes(self) -> tuple[int, ...]:
        return REDUCE_CHANNEL if self.granularity is Granularity.CHANNEL else REDUCE_GROUP

    @property
    def parts(self) -> list[Part]:
        _P, L, _Q = self.pqr
        if self.granularity in (Granularity.TENSOR, Granularity.CHANNEL):
            return [Part(0, L, 1, L)]
        G = int(self.group)  # type: ignore[arg-type]
        full = L // G
        out = []
        if full:
            out.append(Part(0, full * G, full, G))
        if L % G:
            out.append(Part(full * G, L, 1, L % G))
        return out

    @property
    def n_groups_axis(self) -> int:
        return sum(p.groups for p in self.parts)

    @property
    def scale_shape(self) -> tuple[int, ...]:
        nd = len(self.shape)
        if self.granularity is Granularity.TENSOR:
            return (1,) * nd
        if self.tiles is not None:
            rows, cols = tile_grid(self.shape, self.tiles)
            return (rows, cols) if nd > 1 else (cols,)
        a = self.axis
        assert a is not None
        if self.granularity is Granularity.CHANNEL:
            return (1,) * a + (self.shape[a],) + (1,) * (nd - a - 1)
        return (*self.shape[:a], self.n_groups_axis, *self.shape[a + 1 :])

    def view(self, x: np.ndarray, part: Part) -> np.ndarray:
        """The 4-D view of ``x`` (C-contiguous, ``self.shape``) for ``part``."""
        P, L, Q = self.pqr
        if self.granularity is Granularity.TENSOR:
            return x.reshape(1, 1, L, 1)
        if self.granularity is Granularity.CHANNEL:
            return x.reshape(P, L, 1, Q)
        x3 = x.reshape(P, L, Q)
        if part.start == 0 and part.stop == L:
            return x3.reshape(P, part.groups, part.size, Q)
        return x3[:, part.start : part.stop, :].reshape(P, part.groups, part.size, Q)

    def scale4(self, scale: np.ndarray, part_index: int) -> np.ndarray:
        """The stored scale (or zero point) as the 4-D array broadcasting with ``part``."""
        P, L, Q = self.pqr
        if self.granularity is Granularity.TENSOR:
            return scale.reshape(1, 1, 1, 1)
        if self.granularity is Granularity.CHANNEL:
            return scale.reshape(1, L, 1, 1)
        s3 = scale.reshape(P, self.n_groups_axis, Q)
        g0 = sum(p.groups for p in self.parts[:part_index])
        g = self.parts[part_index].groups
        return s3[:, g0 : g0 + g, :].reshape(P, g, 1, Q)

    def join_scales(self, scales: list[np.ndarray]) -> np.ndarray:
        """Per-part 4-D scales -> the stored scale array."""
        if len(scales) == 1:
            return scales[0].reshape(self.scale_shape)
        return np.concatenate(scales, axis=1).reshape(self.scale_shape)


def make_layout(shape: tuple[int, ...], scheme: Scheme) -> Layout:
    """Check the scheme against the shape and return the layout.

    Raises:
        LowbitError: axis out of range, or a group size that does not divide the axis
            when ``pad=False``.
    """
    nd = len(shape)
    g = scheme.granularity
    if g is Granularity.TENSOR:
        return Layout(shape, g, None, None)
    if g is Granularity.TILE:
        if nd == 0:
            raise LowbitError("a 0-d tensor has no tiles; quantize it per tensor")
        return Layout(shape, g, None, None, scheme.block_shape)
    axis = scheme.axis
    assert axis is not None
    if nd == 0 or not -nd <= axis < nd:
        raise LowbitError(
            f"axis {axis} is out of range for a tensor of shape {shape} (allowed {-nd}..{nd - 1})"
            if nd
            else f"a 0-d tensor has no axis {axis}"
        )
    a = axis % nd
    if g is Granularity.CHANNEL:
        return Layout(shape, g, a, None)
    G = int(scheme.group_size)  # type: ignore[arg-type]
    L = shape[a]
    if L % G and not scheme.pad:
        raise LowbitError(
            f"group size {G} does not divide the length {L} of axis {axis} (shape {shape}) "
            "and pad=False; pass pad=True to let the last group be shorter"
        )
    return Layout(shape, g, a, G)


# ---- the stored arrays of one quantized tensor ------------------------------------

# dtype each scale format is stored in (``QuantizedTensor.to_arrays``)
_SCALE_DTYPES = {
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
    "bfloat16": np.dtype("<u2"),  # bit patterns, as QuantizedTensor.to_arrays stores them
    "float8_e8m0fnu": np.dtype("u1"),
    "float8_e4m3fn": np.dtype("u1"),  # E4M3 codes
}


_STORE_DTYPE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}


def _store_scale(scale: np.ndarray, scheme: Scheme) -> np.ndarray:
    sf = scheme.scale_format
    if sf == "float8_e4m3fn":
        return lookup(sf).encode(scale.astype(np.float32), saturate=False).astype(np.uint8)
    if sf == "float8_e8m0fnu":
        shift = mx_format(scheme.format).int_shift if scheme.is_mx else 0
        s = scale.astype(np.float64)
        nanm = ~np.isfinite(s)
        _, e = np.frexp(np.where(nanm, 1.0, s))
        codes = e8m0_codes(e.astype(np.int64) - 1 + shift)
        return np.where(nanm, np.uint8(0xFF), codes).astype(np.uint8)
    if sf == "bfloat16":
        return scale.astype(bfloat16()).view(np.uint16)
    return scale.astype(_STORE_DTYPE[sf])


def _load_scale(stored: np.ndarray, scheme: Scheme, prefix: str) -> np.ndarray:
    sf = scheme.scale_format
    expect = np.uint8 if sf in ("float8_e8m0fnu", "float8_e4m3fn") else _STORE_DTYPE[sf]
    if stored.dtype != np.dtype(expect):
        raise LowbitError(
            f"array {prefix}scale has dtype {stored.dtype}; a {sf} scale is stored as {np.dtype(expect)}"
        )
    if sf == "float8_e4m3fn":
        return lookup(sf).decode(stored, dtype=np.float32)
    if sf == "float8_e8m0fnu":
        shift = mx_format(scheme.format).int_shift if scheme.is_mx else 0
        e = stored.astype(np.int32) - 127 - shift
        out = np.ldexp(np.float32(1.0), e).astype(np.float32)
        return np.where(stored == 0xFF, np.float32(np.nan), out)
    if sf == "bfloat16":
        return stored.view(bfloat16()).astype(np.float32)
    return stored.astype(np.float32)


@dataclass(frozen=True)
class ArraySpec:
    """One stored array: its key suffix, dtype and shape."""

    suffix: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def quantized_arrays(shape: Sequence[int], scheme: Scheme) -> list[ArraySpec]:
    """The arrays ``QuantizedTensor.to_arrays`` gives for a tensor of ``shape`` and ``scheme``.

    Known before quantizing, so a checkpoint's headers can be written first and each tensor
    quantized only when its bytes are due. The sum of their ``nbytes`` is the quantized
    tensor's ``nbytes`` (the size a lowbit checkpoint stores for it).

    Args:
        shape: the tensor's shape.
        scheme: how it is quantized.

    Returns:
        One :class:`ArraySpec` per array, in ``to_arrays``' order.
    """
    shape = tuple(int(s) for s in shape)
    bits = scheme.element_format.bits
    layout = make_layout(shape, scheme)
    nscale = math.prod(layout.scale_shape)
    out = [ArraySpec("codes", np.dtype("u1"), (packed_nbytes(math.prod(shape), bits),))]
    if scheme.double_quant:
        out += [
            ArraySpec("scale_codes", np.dtype("u1"), (nscale,)),
            ArraySpec("scale_absmax", np.dtype("<f4"), (-(-nscale // DQ_BLOCK),)),
            ArraySpec("scale_offset", np.dtype("<f4"), (1,)),
        ]
    else:
        out.append(ArraySpec("scale", _SCALE_DTYPES[scheme.scale_format], layout.scale_shape))
    if scheme.tensor_scale:
        out.append(ArraySpec("tensor_scale", np.dtype("<f4"), (1,)))
    if not scheme.symmetric:
        out.append(ArraySpec("zero_point", np.dtype("u1"), (packed_nbytes(nscale, bits),)))
    return out
