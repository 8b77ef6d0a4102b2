"""The quantize/dequantize loops behind ``lowbit.quant`` (see its docstring for the rules).

Work is done per 4-D view (``lowbit._qlayout``) in chunks of about 64K elements along
the first non-trivial axis, so temporaries stay in cache; each chunk is a contiguous
range of the tensor.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from lowbit._enums import Rounding, as_rounding
from lowbit._qlayout import Layout, make_layout
from lowbit.errors import LowbitError
from lowbit.intformat import round_to_integer
from lowbit.packing import _pack_unchecked, unpack
from lowbit.scales import (
    asymmetric_range,
    grid_quantizer,
    int_range,
    meanabs,
    minmax,
    symmetric_clip,
)
from lowbit.scheme import ScaleMethod, Scheme

if TYPE_CHECKING:
    from lowbit.base import Format
    from lowbit.quant import QuantizedTensor

_CHUNK = 1 << 16
_NEAREST = (Rounding.NEAREST_EVEN, Rounding.NEAREST_AWAY)


# ---- chunking ------------------------------------------------------------------------


def _chunks(shape: tuple[int, ...]) -> Iterator[tuple[slice, ...]]:
    """Index tuples covering a 4-D shape in contiguous pieces of about ``_CHUNK`` elements."""
    k = next((i for i, n in enumerate(shape) if n > 1), len(shape) - 1)
    inner = int(np.prod(shape[k + 1 :], dtype=np.int64)) or 1
    step = max(1, _CHUNK // inner)
    for start in range(0, shape[k], step):
        yield (slice(None),) * k + (slice(start, min(start + step, shape[k])),)


def _take(a: np.ndarray | None, idx: tuple[slice, ...]) -> Any:
    """Slice a broadcasting operand like the data (axes of extent 1 stay whole)."""
    if a is None:
        return None
    k = len(idx) - 1
    return a[idx] if a.shape[k] > 1 else a


# ---- scales ----------------------------------------------------------------------------


def round_scale(s64: np.ndarray, scale_format: str) -> np.ndarray:
    """Round float64 scales to the scale format (float32 values); never to zero."""
    if scale_format == "float32":
        with np.errstate(over="ignore"):
            s = s64.astype(np.float32)
        tiny = np.float32(np.finfo(np.float32).smallest_subnormal)
    elif scale_format == "float8_e8m0fnu":
        # round up to a power of two (NVIDIA's RCEIL rule): nothing that absmax keeps clips
        m, e = np.frexp(s64)
        exp = np.where(m == 0.5, e - 1, e).astype(np.int64)
        s = np.ldexp(np.float32(1.0), np.clip(exp, -127, 127).astype(np.int32)).astype(np.float32)
        tiny = np.float32(2.0**-127)
    else:
        from lowbit.catalog import format as lookup

        f = lookup(scale_format)
        s = f.decode(f.encode(s64, saturate=True), dtype=np.float32)
        tiny = np.float32(f.smallest_positive)
    if not np.isfinite(s).all():
        raise LowbitError(
            f"a scale overflows {scale_format} (the input's range is too large for it)"
        )
    return np.where((s == 0) & (s64 > 0), tiny, s).astype(np.float32)


def choose_scale(
    V: np.ndarray,
    axes: tuple[int, ...],
    mn: np.ndarray,
    mx: np.ndarray,
    scheme: Scheme,
    fmt: Format,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(float32 scale, float64 zero point or None, float64 threshold or None) per group."""
    method = scheme.scale_method
    if scheme.is_mx:
        from lowbit.mx import mx_format, scale_values, shared_exponent

        mxf = mx_format(scheme.format)
        exp = shared_exponent(np.maximum(mx, -mn), mxf.emax_elem)
        return scale_values(exp, mxf.int_shift), None, None
    if method is ScaleMethod.MEANABS:
        if fmt.name not in ("binary", "ternary"):
            raise LowbitError(
                f"the meanabs scale is for binary and ternary formats, not {fmt.name}"
            )
        s64, thresh = meanabs(V, axes, fmt.name == "ternary")
        return round_scale(np.where(s64 > 0, s64, 1.0), scheme.scale_format), None, thresh
    if not scheme.symmetric:
        qmin, qmax = int_range(fmt, scheme.restricted_range)
        lo, hi = asymmetric_range(
            V, axes, method, mn, mx, percentile=scheme.percentile, k_std=scheme.k_std,
            qrange=(qmin, qmax),
        )  # fmt: skip
        span = hi - lo
        s32 = round_scale(np.where(span > 0, span / (qmax - qmin), 1.0), scheme.scale_format)
        zp = np.clip(np.rint(qmin - lo / s32.astype(np.float64)), qmin, qmax)
        return s32, zp, None
    qrange = int_range(fmt, scheme.restricted_range) if fmt.kind == "int" else None
    qmax = float(fmt.max)
    quantizer = grid_quantizer(fmt, qrange) if method is ScaleMethod.MSE else None
    c = symmetric_clip(
        V, axes, method, mn, mx, percentile=scheme.percentile, k_std=scheme.k_std,
        quantizer=quantizer, qmax=qmax,
    )  # fmt: skip
    return round_scale(np.where(c > 0, c / qmax, 1.0), scheme.scale_format), None, None


# ---- elements -------------------------------------------------------------------------


def _int_codes(r: np.ndarray, fmt: Format) -> np.ndarray:
    """Integer values (float array, in range) -> two's complement codes."""
    bits = fmt.bits
    if bits <= 8:
        c = r.astype(np.int16).astype(np.uint8)
        return c & np.uint8((1 << bits) - 1) if bits < 8 else c
    c = r.astype(np.int32).astype(np.uint32) & np.uint32((1 << bits) - 1)
    return c.astype(fmt.code_dtype)


def _round_int_nearest(V: np.ndarray, S: np.ndarray, mode: Rounding) -> np.ndarray:
    """round(V / S) of the exact quotient: divide in V's dtype, re-do the ties exactly."""
    t = V / S.astype(V.dtype)
    r = np.rint(t)
    tie = np.abs(t - r) == 0.5
    if tie.any():
        Vb = np.broadcast_to(V, t.shape)[tie]
        Sb = np.broadcast_to(S, t.shape)[tie]
        if V.dtype == np.float32:
            # float64 quotients of float32 values never land on a false tie
            t64 = Vb.astype(np.float64) / Sb.astype(np.float64)
            fixed = np.rint(t64)
            if mode is Rounding.NEAREST_AWAY:
                fl = np.floor(t64)
                fixed = np.where(t64 - fl == 0.5, np.where(t64 > 0, fl + 1, fl), fixed)
        else:
            from lowbit.quant import exact_round_quotient

            fixed = exact_round_quotient(Vb, Sb, mode)
        r[tie] = fixed
    return r


def _encode_chunk(
    V: np.ndarray,
    S: np.ndarray,
    Z: np.ndarray | None,
    T: np.ndarray | None,
    fmt: Format,
    scheme: Scheme,
    mode: Rounding,
    rng: np.random.Generator | None,
) -> np.ndarray:
    kind = fmt.kind
    if T is not None and mode in _NEAREST:  # binary / ternary thresholds (BNN, TWN)
        if fmt.name == "binary":
            return (V >= 0).astype(np.uint8)
        Tt = T.astype(V.dtype)
        return (1 + (V > Tt).astype(np.int8) - (V < -Tt).astype(np.int8)).astype(np.uint8)
    rbits = None
    if mode is Rounding.STOCHASTIC:
        assert rng is not None
        rbits = rng.integers(0, 2**64, size=V.shape, dtype=np.uint64, endpoint=False)
    if kind == "int":
        qmin, qmax = int_range(fmt, scheme.restricted_range and not scheme.is_mx)
        if mode in _NEAREST:
            r = _round_int_nearest(V, S, mode)
        else:
            t = V.astype(np.float64) / S.astype(np.float64)
            r = round_to_integer(t, mode, None if rbits is None else rbits.reshape(-1))
        if Z is not None:
            r += Z.astype(r.dtype)
        np.clip(r, qmin, qmax, out=r)
        return _int_codes(r, fmt)
    t = V.astype(np.float64) / S.astype(np.float64)
    return fmt.encode(t, rounding=mode.value, saturate=True, random_bits=rbits, nan="zero")


def _patch_nonfinite(
    V: np.ndarray,
    mask: np.ndarray,
    codes: np.ndarray,
    s32: np.ndarray,
    fmt: Format,
    axes: tuple[int, ...],
) -> np.ndarray:
    """Under nan='propagate': NaN/inf codes where the format has them, else NaN scales."""
    isnan = np.isnan(V) & mask
    isinf = mask & ~isnan
    lost = np.zeros(V.shape, dtype=bool)
    if fmt.kind == "float":
        nan_code = fmt.nan_code  # type: ignore[attr-defined]
        inf_code = fmt.inf_code  # type: ignore[attr-defined]
        if nan_code is not None:
            codes[isnan] = nan_code
        else:
            lost |= isnan
        if inf_code is not None:
            sign = (V[isinf] < 0).astype(np.uint64) << np.uint64(fmt.magnitude_bits)  # type: ignore[attr-defined]
            codes[isinf] = (np.uint64(inf_code) | sign).astype(codes.dtype)
        elif nan_code is not None:
            codes[isinf] = nan_code
        else:
            lost |= isinf
    else:
        lost = mask  # integers and value sets have no NaN/inf: the group's scale carries it
    if lost.any():
        bad = np.any(lost, axis=axes, keepdims=True)
        s32 = np.where(bad, np.float32(np.nan), s32).astype(np.float32)
    return s32


def encode_tensor(
    arr: np.ndarray, scheme: Scheme, *, seed: Any, nan: str, is_torch: bool
) -> QuantizedTensor:
    """Quantize a C-contiguous float32/float64 array (see ``lowbit.quant.quantize``)."""
    from lowbit.quant import QuantizedTensor

    layout = make_layout(arr.shape, scheme)
    fmt = scheme.element_format
    mode = as_rounding(scheme.rounding)
    rng = None
    if mode is Rounding.STOCHASTIC:
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    axes = layout.reduce_axes
    codes3 = np.empty(layout.pqr, dtype=fmt.code_dtype)
    scales: list[np.ndarray] = []
    zps: list[np.ndarray] = []
    for part in layout.parts:
        V = layout.view(arr, part)
        mn, mx = minmax(V, axes)
        mask = None
        if not (np.isfinite(mn).all() and np.isfinite(mx).all()):
            mask = ~np.isfinite(V)
            if nan == "raise":
                n_nan = int(np.isnan(V).sum())
                n_inf = int(mask.sum()) - n_nan
                raise LowbitError(
                    f"input contains {n_nan} NaN and {n_inf} infinite values; pass "
                    "nan='propagate' to keep them (NaN/inf codes, or NaN group scales)"
                )
            Vorig = V
            V = np.where(mask, V.dtype.type(0), V)
            mn, mx = minmax(V, axes)
        s32, zp, thresh = choose_scale(V, axes, mn, mx, scheme, fmt)
        out = np.empty(V.shape, dtype=fmt.code_dtype)
        for idx in _chunks(V.shape):
            out[idx] = _encode_chunk(
                V[idx], _take(s32, idx), _take(zp, idx), _take(thresh, idx),
                fmt, scheme, mode, rng,
            )  # fmt: skip
        if mask is not None:
            s32 = _patch_nonfinite(Vorig, mask, out, s32, fmt, axes)
        P, _L, Q = layout.pqr
        codes3[:, part.start : part.stop, :] = out.reshape(P, part.stop - part.start, Q)
        scales.append(s32)
        if zp is not None:
            zps.append(zp)
    scale = layout.join_scales(scales)
    zero_point = layout.join_scales(zps).astype(np.int32) if zps else None
    dq = None
    if scheme.double_quant:
        from lowbit.nf4 import double_dequantize, double_quantize

        c8, a2, off = double_quantize(scale)
        dq = (c8, a2, off)
        scale = double_dequantize(c8, a2, off).reshape(scale.shape)
    packed = _pack_unchecked(codes3.reshape(-1), fmt.bits)
    return QuantizedTensor(
        codes=packed,
        scale=scale,
        zero_point=zero_point,
        shape=arr.shape,
        scheme=scheme,
        dq=dq,
        source_torch=is_torch,
    )


# ---- dequantize -------------------------------------------------------------------------


def value_table(fmt: Format, dtype: Any) -> np.ndarray:
    """Value of every code 0 .. 2**bits - 1 in ``dtype`` (NaN for codes a value set lacks)."""
    n = 1 << fmt.bits
    if fmt.kind == "valueset":
        t = np.full(n, np.nan, dtype=dtype)
        t[: fmt.finite_count] = fmt.values().astype(dtype)
        return t
    return fmt.decode(np.arange(n, dtype=np.uint32), dtype=dtype)


def decode_tensor(qt: QuantizedTensor, work: Any) -> np.ndarray:
    """``(value(code) - zp) * scale`` in ``work`` (float32 or float64)."""
    fmt = qt.format
    if fmt.bits > 16:  # pragma: no cover - the scheme rejects them
        raise LowbitError(f"cannot dequantize {fmt.bits}-bit codes")
    layout: Layout = make_layout(qt.shape, qt.scheme)
    table = value_table(fmt, work)
    codes = unpack(qt.codes, fmt.bits, qt.numel)
    P, L, Q = layout.pqr
    out3 = np.empty((P, L, Q), dtype=work)
    codes_full = codes.reshape(qt.shape)
    scale = qt.scale.astype(work)
    zp = qt.zero_point.astype(work) if qt.zero_point is not None else None
    for i, part in enumerate(layout.parts):
        C = layout.view(codes_full, part)
        S = layout.scale4(scale, i)
        Z = layout.scale4(zp, i) if zp is not None else None
        res = np.empty(C.shape, dtype=work)
        for idx in _chunks(C.shape):
            v = table[C[idx]]
            if Z is not None:
                v -= _take(Z, idx)
            v *= _take(S, idx)
            res[idx] = v
        out3[:, part.start : part.stop, :] = res.reshape(P, part.stop - part.start, Q)
    return out3.reshape(qt.shape)
