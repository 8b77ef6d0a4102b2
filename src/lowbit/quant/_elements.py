"""The codes of one chunk: ``round(V / S)`` onto a format, exactly (``lowbit.quant._engine``'s
elements).

Every path gives ``fmt.encode`` of the float64 quotient ``V / S`` (saturating, NaN as 0):
integers round the float32 quotient and redo its ties on the float64 one; value sets
(NF4) and small floats look the float32 quotient up in a table and send the few values
that could sit on a rounding boundary through the exact codec; the compiled kernels of
``lowbit.quant._numba`` do the same in one pass where numba is installed.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

import numpy as np

from lowbit.enums import Rounding
from lowbit.formats.ints import round_to_integer
from lowbit.formats.reference import exact_round_quotient
from lowbit.formats.valueset import rounding_bins
from lowbit.quant import _numba as _fastquant
from lowbit.quant.scales import int_range

if TYPE_CHECKING:
    from lowbit.formats.base import Format
    from lowbit.quant.scheme import Scheme

_NEAREST = (Rounding.NEAREST_EVEN, Rounding.NEAREST_AWAY)


def _int_codes(r: np.ndarray, fmt: Format) -> np.ndarray:
    """Integer values (float array, already clipped to the format) -> two's complement codes."""
    bits = fmt.bits
    if bits <= 8:
        c = r.astype(np.int8).view(np.uint8) if fmt.signed else r.astype(np.uint8)  # type: ignore[attr-defined]
        return c & np.uint8((1 << bits) - 1) if bits < 8 else c
    c = r.astype(np.int32).astype(np.uint32) & np.uint32((1 << bits) - 1)
    return c.astype(fmt.code_dtype)


def _round_int_nearest(V: np.ndarray, S: np.ndarray, mode: Rounding) -> np.ndarray:
    """round(V / S) of the exact quotient: divide in V's dtype, re-do the ties exactly."""
    t = np.divide(V, S.astype(V.dtype, copy=False))
    r = np.rint(t)
    np.subtract(t, r, out=t)
    np.abs(t, out=t)
    tie = t == 0.5
    if tie.any():
        Vb = np.broadcast_to(V, r.shape)[tie]
        Sb = np.broadcast_to(S, r.shape)[tie]
        if V.dtype == np.float32:
            # float64 quotients of float32 values never land on a false tie
            t64 = Vb.astype(np.float64) / Sb.astype(np.float64)
            fixed = np.rint(t64)
            if mode is Rounding.NEAREST_AWAY:
                fl = np.floor(t64)
                fixed = np.where(t64 - fl == 0.5, np.where(t64 > 0, fl + 1, fl), fixed)
        else:
            fixed = exact_round_quotient(Vb, Sb, mode)
        r[tie] = fixed
    return r


def _gather(a: np.ndarray, flat_index: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``np.broadcast_to(a, shape).reshape(-1)[flat_index]`` without materialising it."""
    if a.shape == shape and a.flags.c_contiguous:
        return a.reshape(-1)[flat_index]
    idx = np.unravel_index(flat_index, shape)
    return a[tuple(i if n > 1 else np.zeros_like(i) for i, n in zip(idx, a.shape, strict=True))]


def _valueset_nearest(V: np.ndarray, S: np.ndarray, fmt: Format, mode: Rounding) -> np.ndarray:
    """Nearest table entry of V/S, equal to ``fmt.encode`` of the float64 quotient.

    Values are binned on a uniform grid finer than the gaps between midpoints, so a bin
    with no midpoint in or near it has one code. The few values in "risky" bins get the
    float32 quotient compared with the midpoints; those within 2**-20 of one (float32
    rounding could put them on the wrong side, or they tie) go through the exact codec.
    """
    base, risky, mids, tol, lo, inv_w = rounding_bins(fmt)
    k64 = inv_w / S.astype(np.float64)
    if np.any(k64 > np.finfo(np.float32).max):  # tiny scales: the bins overflow float32
        t = V.astype(np.float64) / S.astype(np.float64)
        return fmt.encode(t, rounding=mode.value, saturate=True, nan="zero")
    k = k64.astype(np.float32)
    b = np.multiply(V, k, dtype=np.float32)
    b -= np.float32(lo * inv_w)
    np.clip(b, 0, base.size - 1, out=b)
    bi = b.astype(np.intp)
    code = np.take(base, bi)
    r = np.take(risky, bi)
    if r.any():
        at = np.flatnonzero(r)
        Vs, Ss = _gather(V, at, code.shape), _gather(S, at, code.shape).astype(np.float32)
        t = np.divide(Vs, Ss, dtype=np.float32).astype(np.float64)
        c = np.searchsorted(mids, t, side="left")
        j = np.clip(c, 1, mids.size) - 1
        jn = np.clip(c, 0, mids.size - 1)
        near = (np.abs(t - mids[j]) <= tol) | (np.abs(t - mids[jn]) <= tol)
        if near.any():
            c[near] = fmt.encode(
                Vs[near].astype(np.float64) / Ss[near].astype(np.float64),
                rounding=mode.value, saturate=True, nan="zero",
            )  # fmt: skip
        code.reshape(-1)[at] = c
    return code


@cache
def _float_lut(fmt: Format) -> tuple[np.ndarray, np.ndarray, int]:
    """Code of every bin of float32 values that agree in sign, exponent and the top
    ``mbits + 1`` mantissa bits (saturating, nearest), and whether a bin's lower edge is a
    rounding boundary (a midpoint between two values of ``fmt``)."""
    shift = 23 - (fmt.mbits + 1)  # type: ignore[attr-defined]
    keys = np.arange(1 << (32 - shift), dtype=np.uint64)
    interior = ((keys << np.uint64(shift)) | np.uint64(1 << (shift - 1))).astype(np.uint32)
    with np.errstate(invalid="ignore"):  # the exponent-255 keys are NaNs; unused
        rep = interior.view(np.float32).astype(np.float64)
    finite = np.isfinite(rep)
    rep = np.where(finite, rep, np.copysign(fmt.max, rep))
    lut = fmt.encode(rep, saturate=True).astype(np.uint8)
    mag = keys & np.uint64((1 << (31 - shift)) - 1)
    boundary = np.zeros(keys.size, dtype=bool)
    boundary[1:] = lut[1:] != lut[:-1]
    boundary &= mag != 0
    return lut, boundary, shift


def _float_nearest(V: np.ndarray, S: np.ndarray, fmt: Format, mode: Rounding) -> np.ndarray:
    """``fmt.encode(V/S, saturate=True)`` for float32 V and a small float format.

    The float32 quotient's top bits index a table; the boundaries between codes are
    midpoints with ``mbits + 1`` significant bits, exactly representable in float32, so
    a float32 quotient is on the correct side of each unless it equals one: those (ties,
    true or made by the float32 division) go through the exact codec.
    """
    lut, boundary, shift = _float_lut(fmt)
    t = np.divide(V, S.astype(np.float32, copy=False), dtype=np.float32)
    u = t.view(np.uint32)
    key = (u >> np.uint32(shift)).astype(np.intp)
    code = np.take(lut, key)
    edge = (u & np.uint32((1 << shift) - 1)) == 0
    if edge.any():
        at = np.flatnonzero(edge)
        tie = boundary[key.reshape(-1)[at]]
        if tie.any():
            at = at[tie]
            Vb = _gather(V, at, t.shape).astype(np.float64)
            Sb = _gather(S, at, t.shape).astype(np.float64)
            code.reshape(-1)[at] = fmt.encode(
                Vb / Sb, rounding=mode.value, saturate=True, nan="zero"
            )
    return code


def served_codes(V: np.ndarray, S: np.ndarray, fmt: Format) -> np.ndarray:
    """Codes as compressed-tensors and vLLM's references compute them for NVFP4 and its MX
    rule and FP8 tiles: the quotient rounded to float32 first (``x / s`` in float32), then to
    the nearest element (ties to even, saturating); an FP4 zero quotient of either sign is
    code 0."""
    t = np.divide(V.astype(np.float32, copy=False), S.astype(np.float32, copy=False))
    codes = fmt.encode(t, saturate=True, nan="zero")
    if fmt.bits != 4:  # torch's FP8 cast and compressed-tensors' FP6 cast keep -0's sign
        return codes
    return np.where(t == 0, codes.dtype.type(0), codes)  # its FP4 cast drops it


# A clip far below an outlier makes x/s overflow: that saturates, and is no error.
@np.errstate(over="ignore", invalid="ignore")
def encode_chunk(
    V: np.ndarray,
    S: np.ndarray,
    Z: np.ndarray | None,
    T: np.ndarray | None,
    fmt: Format,
    scheme: Scheme,
    mode: Rounding,
    rng: np.random.Generator | None,
) -> np.ndarray:
    """The codes of one chunk ``V`` (finite) with its broadcasting scales ``S``, zero
    points ``Z`` and binary/ternary thresholds ``T``."""
    if V.ndim == 4 and V.shape[3] == 1:  # one-element inner loops are slow: drop the axis
        Z3 = None if Z is None else Z[..., 0]
        T3 = None if T is None else T[..., 0]
        return encode_chunk(V[..., 0], S[..., 0], Z3, T3, fmt, scheme, mode, rng)[..., None]
    kind = fmt.kind
    if scheme.served_rounding:
        return served_codes(V, S, fmt)
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
        if mode in _NEAREST and Z is None and fmt.bits <= 8:
            away = mode is Rounding.NEAREST_AWAY
            fast = _fastquant.scaled_int_codes(V, S, away, qmin, qmax, fmt.bits)
            if fast is not None:
                return fast
        if mode in _NEAREST:
            r = _round_int_nearest(V, S, mode)
        else:
            t = V.astype(np.float64) / S.astype(np.float64)
            r = round_to_integer(t, mode, None if rbits is None else rbits.reshape(-1))
        if Z is not None:
            r += Z.astype(r.dtype)
        np.clip(r, qmin, qmax, out=r)
        return _int_codes(r, fmt)
    if mode in _NEAREST and fmt.bits <= 8:
        fast = None
        if kind == "valueset":
            fast = _fastquant.scaled_valueset_codes(V, S, fmt, mode)
        elif kind == "float":
            away = int(mode is Rounding.NEAREST_AWAY)
            fast = _fastquant.scaled_float_codes(V, S, fmt, away)
        if fast is not None:
            return fast
        if V.dtype == np.float32 and kind == "valueset":
            return _valueset_nearest(V, S, fmt, mode)
        if V.dtype == np.float32 and kind == "float":
            return _float_nearest(V, S, fmt, mode)
    t = V.astype(np.float64) / S.astype(np.float64)
    return fmt.encode(t, rounding=mode.value, saturate=True, random_bits=rbits, nan="zero")
