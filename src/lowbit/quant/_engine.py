"""The quantize/dequantize loops behind ``lowbit.quant.tensor`` (see its docstring for the rules).

Work is done per 4-D view (``lowbit.quant.layout``) in chunks along the first non-trivial
axis (1M elements with the compiled kernels, 128K on the numpy path so temporaries stay
in cache), each a contiguous range of the tensor, in bands on ``lowbit._parallel``'s
threads. The codes of one chunk come from ``lowbit.quant._elements``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from functools import cache
from typing import Any, NamedTuple

import numpy as np

from lowbit._parallel import map_chunks
from lowbit.codecs import _numba as _fast
from lowbit.codecs.packing import _pack_unchecked, packed_nbytes, unpack
from lowbit.enums import Rounding, as_rounding
from lowbit.errors import LowbitError
from lowbit.formats.base import Format
from lowbit.quant import _numba as _fastquant
from lowbit.quant._choose import (
    choose_scale,
    effective_scale,
    own_tensor_scale,
    value_table,
)
from lowbit.quant._elements import encode_chunk
from lowbit.quant._ggml import encode_ggml
from lowbit.quant._range import scales_at_floor
from lowbit.quant._tiles import decode_tiles, encode_tiles
from lowbit.quant.layout import Layout, make_layout
from lowbit.quant.nf4 import double_dequantize, double_quantize
from lowbit.quant.scales import (
    minmax,
)
from lowbit.quant.scheme import Granularity, ScaleMethod, Scheme


class Encoded(NamedTuple):
    """What ``encode_tensor`` makes (``lowbit.quant.tensor`` wraps it in a QuantizedTensor)."""

    codes: np.ndarray  # uint8 bytes of the packed codes
    scale: np.ndarray  # float32 scales (dequantized ones under double quantization)
    zero_point: np.ndarray | None  # int32, asymmetric integers only
    dq: tuple[np.ndarray, np.ndarray, np.float32] | None  # NF4 double-quantization state
    floored: bool  # every scale at its format's floor: the caller checks for underflow
    ts: tuple[np.ndarray, np.float32] | None = None  # two-level: (group scales, tensor scale)


# Elements per chunk, measured on the bench matrix: the numpy path's temporaries want
# the cache (best of 2**13..2**18); the compiled kernels stream, and larger chunks cut
# the per-chunk Python work that holds the GIL while other threads wait (2**17..2**21).
_CHUNK_NUMPY = 1 << 17
_CHUNK_FAST = 1 << 20


# ---- chunking ------------------------------------------------------------------------


def _chunk_axis(shape: tuple[int, ...]) -> int:
    """The axis chunks run along: the first one longer than 1."""
    return next((i for i, n in enumerate(shape) if n > 1), len(shape) - 1)


def _chunks(shape: tuple[int, ...]) -> Iterator[tuple[tuple[slice, ...], int, int]]:
    """(index, first flat element, end flat element) of contiguous pieces of a 4-D shape,
    about ``_CHUNK_FAST`` (compiled kernels) or ``_CHUNK_NUMPY`` elements each; every piece but the last is a multiple of 8 elements,
    so bit-packed codes of any width start on a byte boundary."""
    k = _chunk_axis(shape)
    inner = int(np.prod(shape[k + 1 :], dtype=np.int64)) or 1
    align = 8 // math.gcd(inner, 8)

    def step_of(size: int) -> int:
        step = max(1, size // inner)
        return min(max(align, step - step % align), max(shape[k], 1))

    step = step_of(_CHUNK_NUMPY)
    if _fast.enabled() and step_of(_CHUNK_FAST) != step:  # other pieces than without kernels
        _fast.taken()
        step = step_of(_CHUNK_FAST)
    for start in range(0, shape[k], step):
        stop = min(start + step, shape[k])
        yield (slice(None),) * k + (slice(start, stop),), start * inner, stop * inner


def _take(a: np.ndarray | None, idx: tuple[slice, ...]) -> Any:
    """Slice a broadcasting operand like the data (axes of extent 1 stay whole)."""
    if a is None:
        return None
    k = len(idx) - 1
    return a[idx] if a.shape[k] > 1 else a


# ---- scales ----------------------------------------------------------------------------


def _patch_nonfinite(
    V: np.ndarray,
    mask: np.ndarray,
    codes: np.ndarray,
    s32: np.ndarray,
    fmt: Format,
    axes: tuple[int, ...],
) -> np.ndarray:
    """Under nan='propagate': NaN/inf codes where the format has them (in place), and the
    scales with NaN for the groups holding a value the format cannot represent."""
    if fmt.kind == "float":
        isnan = np.isnan(V) & mask
        isinf = mask & ~isnan
        nan_code = fmt.nan_code  # type: ignore[attr-defined]
        inf_code = fmt.inf_code  # type: ignore[attr-defined]
        if nan_code is not None:
            codes[isnan] = nan_code
        if inf_code is not None:
            sign = (V[isinf] < 0).astype(np.uint64) << np.uint64(fmt.magnitude_bits)  # type: ignore[attr-defined]
            codes[isinf] = (np.uint64(inf_code) | sign).astype(codes.dtype)
        elif nan_code is not None:
            codes[isinf] = nan_code
    lost = _lost_mask(V, mask, fmt)
    if s32.size and lost.any():
        bad = np.any(lost, axis=axes, keepdims=True)
        s32 = np.where(bad, np.float32(np.nan), s32).astype(np.float32)
    return s32


def _extremes(
    V: np.ndarray, axes: tuple[int, ...], scheme: Scheme
) -> tuple[np.ndarray, np.ndarray]:
    """Per-group (min, max); (-amax, amax) where the scale depends on the largest
    magnitude alone (symmetric absmax, MX), which one integer max finds faster."""
    only_amax = scheme.is_mx or (scheme.symmetric and scheme.scale_method is ScaleMethod.ABSMAX)
    if only_amax and V.ndim and [a for a in axes if V.shape[a] != 1] == [V.ndim - 1]:
        am = _fastquant.row_absmax(V)
        if am is not None:
            return -am, am
    G = V.shape[-1] if V.ndim else 1
    if axes == (V.ndim - 1,) and G > 1 and V.flags.c_contiguous and V.size:
        fast = _fastquant.row_minmax(V)  # the compiled path, where numba is installed
        if fast is not None:
            return fast
    return minmax(V, axes)


def _scales_for(
    V: np.ndarray,
    axes: tuple[int, ...],
    scheme: Scheme,
    fmt: Format,
    nan: str,
    g: np.float32 | None = None,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None, np.ndarray]:
    """Scale, zero point, threshold per group of ``V``; the non-finite mask (or None) and
    the data to encode (non-finite values replaced by 0 under nan='propagate')."""
    if V.ndim == 4 and V.shape[3] == 1:
        # a trailing axis of length 1 makes numpy's inner loops one element long
        out = _scales_for(V[..., 0], tuple(a for a in axes if a != 3), scheme, fmt, nan, g)
        return tuple(None if a is None else a[..., None] for a in out)  # type: ignore[return-value]
    mn, mx = _extremes(V, axes, scheme)
    mask = None
    if not (np.isfinite(mn).all() and np.isfinite(mx).all()):
        mask = ~np.isfinite(V)
        if nan == "raise":
            n_nan = int(np.isnan(V).sum())
            raise LowbitError(
                f"input contains {n_nan} NaN and {int(mask.sum()) - n_nan} infinite values; "
                "pass nan='propagate' to keep them (NaN/inf codes, or NaN group scales)"
            )
        V = np.where(mask, V.dtype.type(0), V)
        mn, mx = _extremes(V, axes, scheme)
    s32, zp, thresh = choose_scale(V, axes, mn, mx, scheme, fmt, g)
    return s32, zp, thresh, mask, V


def _all_finite(arr: np.ndarray) -> bool:
    """``np.isfinite(arr).all()`` in chunks of a few MB on the chunk threads (one pass over an
    8B layer, not a whole-tensor boolean array on one core)."""
    flat = arr.reshape(-1)
    step = 1 << 22
    return all(map_chunks(lambda i: bool(np.isfinite(flat[i : i + step]).all()),
                          range(0, flat.size, step)))  # fmt: skip


def encode_tensor(
    arr: np.ndarray, scheme: Scheme, *, seed: Any, nan: str, tensor_scale: Any = None
) -> Encoded:
    """Quantize a C-contiguous float32/float64 array (see ``lowbit.quant.tensor.quantize``).

    When the groups do not cross chunks (groups along an axis, per-channel on the first
    axis), each chunk is read once: its statistics, scales, codes and packed bytes are
    computed while it is in cache.
    """
    if scheme.scale_method is ScaleMethod.GGML:
        return Encoded(*encode_ggml(arr, scheme))
    if scheme.granularity is Granularity.TILE:
        codes, tile_scale = encode_tiles(arr, scheme, nan)
        return Encoded(codes=codes, scale=tile_scale, zero_point=None, dq=None, floored=False)
    layout = make_layout(arr.shape, scheme)
    fmt = scheme.element_format
    bits = fmt.bits
    mode = as_rounding(scheme.rounding)
    rng = None
    if mode is Rounding.STOCHASTIC:
        try:
            rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        except (TypeError, ValueError) as exc:  # a negative or non-integer seed
            raise LowbitError(f"seed {seed!r}: {exc} (or pass a numpy Generator)") from None
    axes = layout.reduce_axes
    parts = layout.parts
    g = None
    if scheme.tensor_scale:
        if nan == "raise" and not _all_finite(arr):
            raise LowbitError(
                f"input contains {int(np.isnan(arr).sum())} NaN and "
                f"{int(np.isinf(arr).sum())} infinite values; pass nan='propagate' to keep "
                "them (NaN group scales)"
            )
        g = tensor_scale if tensor_scale is not None else own_tensor_scale(arr, scheme)
        # NVFP4 itself (the label's scheme, nearest-even and all): one compiled pass; the
        # input is finite (checked above)
        if nan == "raise" and scheme.label == "nvfp4":
            fast = _fastquant.nvfp4_encode(arr, np.float32(g))
            if fast is not None:
                packed, s, e = fast
                return Encoded(codes=packed, scale=e, zero_point=None, dq=None,
                               floored=scales_at_floor(s, scheme), ts=(s, g))  # fmt: skip
    direct = len(parts) == 1  # chunks are contiguous ranges of the tensor: pack as we go
    packed = np.empty(packed_nbytes(arr.size, bits), dtype=np.uint8) if direct else None
    codes3 = None if direct else np.empty(layout.pqr, dtype=fmt.code_dtype)
    scales: list[np.ndarray] = []
    zps: list[np.ndarray] = []

    def emit(codes: np.ndarray, e0: int, e1: int, part_out: np.ndarray | None, idx: Any) -> None:
        if packed is not None:
            b0 = e0 * bits // 8
            flat = codes.reshape(-1)
            if bits == 8 and flat.dtype == np.uint8:  # the codes are the bytes: one copy
                packed[e0:e1] = flat
                return
            packed[b0 : b0 + packed_nbytes(e1 - e0, bits)] = _pack_unchecked(flat, bits)
        else:
            assert part_out is not None
            part_out[idx] = codes

    for part in parts:
        V = layout.view(arr, part)
        part_out = None if direct else np.empty(V.shape, dtype=fmt.code_dtype)
        k = _chunk_axis(V.shape)
        chunks = list(_chunks(V.shape))
        serial = rng is not None  # random bits are drawn chunk after chunk
        if k not in axes:  # fused: every group lies inside one chunk

            def fused(item: Any, V: np.ndarray = V, part_out: Any = part_out) -> tuple[Any, Any]:
                idx, e0, e1 = item
                s32, zp, thresh, mask, Vc = _scales_for(V[idx], axes, scheme, fmt, nan, g)
                codes = encode_chunk(
                    Vc, effective_scale(s32, g), zp, thresh, fmt, scheme, mode, rng
                )
                if mask is not None:
                    s32 = _patch_nonfinite(V[idx], mask, codes, s32, fmt, axes)
                emit(codes, e0, e1, part_out, idx)
                return s32, zp

            done = [fused(c) for c in chunks] if serial else map_chunks(fused, chunks)
            s_list = [s for s, _ in done]
            z_list = [z for _, z in done if z is not None]
            scales.append(np.concatenate(s_list, axis=k) if len(s_list) > 1 else s_list[0])
            if z_list:
                zps.append(np.concatenate(z_list, axis=k) if len(z_list) > 1 else z_list[0])
        else:
            s32, zp, thresh, mask, Vz = _scales_for(V, axes, scheme, fmt, nan, g)
            eff = effective_scale(s32, g)

            def encode(
                item: Any, V: np.ndarray = V, Vz: np.ndarray = Vz, part_out: Any = part_out,
                eff: np.ndarray = eff, zp: Any = zp, thresh: Any = thresh, mask: Any = mask,
            ) -> None:  # fmt: skip
                idx, e0, e1 = item
                codes = encode_chunk(
                    Vz[idx], _take(eff, idx), _take(zp, idx), _take(thresh, idx),
                    fmt, scheme, mode, rng,
                )  # fmt: skip
                if mask is not None and mask[idx].any():  # NaN/inf codes (scales below)
                    _patch_nonfinite(V[idx], mask[idx], codes, eff[:0], fmt, axes)
                emit(codes, e0, e1, part_out, idx)

            _ = [encode(c) for c in chunks] if serial else map_chunks(encode, chunks)
            if mask is not None:
                lost = _lost_mask(V, mask, fmt)
                s32 = np.where(np.any(lost, axis=axes, keepdims=True), np.float32(np.nan), s32)
            scales.append(s32.astype(np.float32))
            if zp is not None:
                zps.append(zp)
        if codes3 is not None:
            assert part_out is not None
            P, _, Q = layout.pqr
            codes3[:, part.start : part.stop, :] = part_out.reshape(P, part.stop - part.start, Q)
    scale = layout.join_scales(scales)
    floored = scales_at_floor(scale, scheme)
    zero_point = layout.join_scales(zps).astype(np.int32) if zps else None
    dq = None
    if scheme.double_quant:
        c8, a2, off = double_quantize(scale)
        dq = (c8, a2, off)
        scale = double_dequantize(c8, a2, off).reshape(scale.shape)
    if packed is None:
        assert codes3 is not None
        packed = _pack_unchecked(codes3.reshape(-1), bits)
    ts = None
    if g is not None:
        ts = (scale, g)
        scale = effective_scale(scale, g)
    return Encoded(codes=packed, scale=scale, zero_point=zero_point, dq=dq, floored=floored, ts=ts)


def _lost_mask(V: np.ndarray, mask: np.ndarray, fmt: Format) -> np.ndarray:
    """Non-finite elements the format cannot hold (their group's scale becomes NaN)."""
    if fmt.kind != "float":
        return mask
    isnan = np.isnan(V) & mask
    isinf = mask & ~isnan
    lost = np.zeros(V.shape, dtype=bool)
    if fmt.nan_code is None:  # type: ignore[attr-defined]
        lost |= isnan
        if fmt.inf_code is None:  # type: ignore[attr-defined]
            lost |= isinf
    return lost


# ---- dequantize -------------------------------------------------------------------------


@cache
def _pair_table(fmt: Format, dtype: Any) -> np.ndarray:
    """Values of both nibbles of every byte: ``[b] -> (value(b & 15), value(b >> 4))``."""
    t = value_table(fmt, dtype)
    b = np.arange(256)
    return np.stack([t[b & 15], t[b >> 4]], axis=1)


def decode_tensor(
    packed: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None,
    shape: tuple[int, ...],
    scheme: Scheme,
    work: Any,
) -> np.ndarray:
    """``(value(code) - zp) * scale`` in ``work`` (float32 or float64), chunk by chunk, for
    packed codes of a tensor of ``shape`` quantized with ``scheme``."""
    fmt = scheme.element_format
    bits = fmt.bits
    if bits > 16:  # pragma: no cover - the scheme rejects them
        raise LowbitError(f"cannot dequantize {bits}-bit codes")
    work = np.dtype(work)
    if scheme.granularity is Granularity.TILE:
        return decode_tiles(packed, scale, shape, scheme, work)
    layout: Layout = make_layout(shape, scheme)
    table = value_table(fmt, work)
    scale = scale.astype(work)
    zp = zero_point.astype(work) if zero_point is not None else None
    parts = layout.parts
    out = np.empty(shape, dtype=work)
    if len(parts) == 1:
        O = layout.view(out, parts[0])  # a view: writes land in ``out``
        S = layout.scale4(scale, 0)
        Z = layout.scale4(zp, 0) if zp is not None else None
        pairs = _pair_table(fmt, work) if bits == 4 else None

        def decode(item: Any) -> None:
            idx, e0, e1 = item
            n = e1 - e0
            dst = O[idx]
            if pairs is not None:
                v = np.take(pairs, packed[e0 // 2 : (e1 + 1) // 2], axis=0).reshape(-1)[:n]
            elif bits == 8:
                Zc = None if Z is None else _take(Z, idx)
                if _fastquant.dequantize8(packed[e0:e1], table, _take(S, idx), Zc, dst):
                    return
                v = np.take(table, packed[e0:e1])
            else:
                b0 = e0 * bits // 8
                c = unpack(packed[b0 : b0 + (n * bits + 7) // 8], bits, n)
                v = np.take(table, c)
            Sc = _take(S, idx)
            Zc = None if Z is None else _take(Z, idx)
            while dst.ndim > 1 and dst.shape[-1] == 1:  # one-element inner loops are slow
                dst, Sc = dst[..., 0], Sc[..., 0]
                Zc = None if Zc is None else Zc[..., 0]
            v = v.reshape(dst.shape)
            if Zc is not None:
                v -= Zc
            with np.errstate(over="ignore"):  # saturated below
                np.multiply(v, Sc, out=dst)

        map_chunks(decode, list(_chunks(O.shape)))
        return out
    # two parts (a ragged last group): rows of the P axis at a time, each part of them
    P, L, Q = layout.pqr
    c3 = unpack(packed, bits, math.prod(shape)).reshape(P, L, Q)
    out3 = out.reshape(P, L, Q)
    step = max(1, _CHUNK_NUMPY // max(1, L * Q))

    def decode_rows(p0: int) -> None:
        p1 = min(p0 + step, P)
        for i, part in enumerate(parts):
            C = c3[p0:p1, part.start : part.stop, :].reshape(p1 - p0, part.groups, part.size, Q)
            v = np.take(table, C)
            S4 = layout.scale4(scale, i)[p0:p1]
            Z4 = None if zp is None else layout.scale4(zp, i)[p0:p1]
            if Q == 1:  # one-element inner loops are slow
                v, S4 = v[..., 0], S4[..., 0]
                Z4 = None if Z4 is None else Z4[..., 0]
            if Z4 is not None:
                v -= Z4
            with np.errstate(over="ignore"):  # an asymmetric overshoot: saturated below
                v *= S4
            out3[p0:p1, part.start : part.stop, :] = v.reshape(p1 - p0, part.stop - part.start, Q)

    map_chunks(decode_rows, list(range(0, P, step)))
    return out
