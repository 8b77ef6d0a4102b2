"""The general float encoder: one rounding from the exact value, on float64 bit fields.

A float64 ``x`` is ``sig * 2**ex`` with an integer ``sig < 2**53``; the target grid near
``x`` has spacing ``2**q`` (``q = max(floor(log2|x|), emin) - mbits``), so the rounded
magnitude is the integer ``n = round(sig / 2**(q - ex))`` and the magnitude code is
``((max(floor(log2|x|), emin) + bias - 1) << mbits) + n``: a carry out of the mantissa
moves into the exponent field by itself. Overflow, infinities, NaN and the sign are
patched afterwards. float32, float16 and bfloat16 inputs widen to float64 exactly, so
the same code serves every input dtype and rounding mode with a single rounding.

Work is done in chunks that fit the CPU cache. This is the loop every other encoder is
tested against (``lowbit.formats.reference`` checks it); ``vectorised`` (the entry point)
and ``_numpy_fast`` (whose code tables it builds) both sit above it.
"""

from __future__ import annotations

import numpy as np

from lowbit.codecs._common import FloatFields, nan_error, negative_error
from lowbit.enums import NaN, Rounding

CHUNK = 1 << 15
_U = np.uint64
_ONE = np.uint64(1)
_MASK52 = np.uint64((1 << 52) - 1)
_IMPLICIT = np.uint64(1 << 52)


def encode_general(
    fmt: FloatFields,
    flat: np.ndarray,
    mode: Rounding,
    saturate: bool,
    rbits: np.ndarray | None,
    nan_check: bool,
    neg_check: bool,
) -> np.ndarray:
    """Codes of flat ``x`` by ``_encode_chunk`` per chunk: every mode and input dtype (the
    general loop the other paths are tested against)."""
    out = np.empty(flat.size, dtype=fmt.code_dtype)
    with np.errstate(invalid="ignore"):  # bfloat16 tests and comparisons warn on NaN
        if nan_check and np.isnan(flat).any():
            raise nan_error(fmt)
        if neg_check and (flat < 0).any():
            raise negative_error(fmt)
    for start in range(0, flat.size, CHUNK):
        sl = slice(start, start + CHUNK)
        out[sl] = _encode_chunk(
            fmt, widen(flat[sl]), mode, saturate, None if rbits is None else rbits[sl]
        )
    return out


def widen(x: np.ndarray) -> np.ndarray:
    """``x`` as float64 (exact for every input dtype the encoder takes)."""
    if x.dtype == np.float64:
        return x
    with np.errstate(invalid="ignore"):  # signalling NaNs widen quietly
        return x.astype(np.float64)


def _encode_chunk(
    fmt: FloatFields, x: np.ndarray, mode: Rounding, saturate: bool, rbits: np.ndarray | None
) -> np.ndarray:
    m, bias, emin = fmt.mbits, fmt.bias, fmt.emin
    u = x.view(_U)
    neg = (u >> _U(63)) != 0
    E = ((u >> _U(52)) & _U(0x7FF)).astype(np.int64)
    F = u & _MASK52
    special = E == 0x7FF
    isnan = special & (F != 0)
    isinf = special & (F == 0)
    sub64 = E == 0
    sig = np.where(sub64, F, F | _IMPLICIT) << _ONE  # one spare bit so the shift is >= 1
    ex = np.where(sub64, -1074, E - 1075) - 1
    e = np.where(sub64, -1075, E - 1023)  # float64 subnormals sit below every target grid
    eff = np.maximum(e, emin)
    shift = (eff - m) - ex
    big = shift > 62
    sig_exact = sig
    sig = np.where(big, (sig != 0).astype(_U), sig)
    s = np.minimum(shift, 62).astype(_U)
    floor = sig >> s
    rem = sig & ((_ONE << s) - _ONE)
    half = _ONE << (s - _ONE)
    if mode is Rounding.NEAREST_EVEN:
        up = (rem > half) | ((rem == half) & ((floor & _ONE) == _ONE))
    elif mode is Rounding.NEAREST_AWAY:
        up = rem >= half
    elif mode is Rounding.TOWARD_ZERO:
        up = np.zeros(x.shape, dtype=bool)
    elif mode is Rounding.TOWARD_POSITIVE:
        up = (rem != 0) & ~neg
    elif mode is Rounding.TOWARD_NEGATIVE:
        up = (rem != 0) & neg
    else:
        assert rbits is not None
        # round up iff rbits < r * 2**64, r = rem / 2**s the fraction of the gap
        up = rbits < (rem << (_U(64) - s))
        if big.any():
            up = np.where(big, rbits < _tiny_threshold(sig_exact, shift), up)
    n = (floor + up.astype(_U)).astype(np.int64)
    mag = np.left_shift(eff + (bias - 1), m) + n

    if not fmt.subnormals:
        mag = _patch_no_subnormal_zone(fmt, x, neg, mag, mode, rbits)

    maxc = fmt.max_code_magnitude
    ovf = (mag > maxc) & ~special
    if mode is Rounding.TOWARD_ZERO:
        tz_like = np.ones(x.shape, dtype=bool)
    elif mode is Rounding.TOWARD_POSITIVE:
        tz_like = neg
    elif mode is Rounding.TOWARD_NEGATIVE:
        tz_like = ~neg
    else:
        tz_like = np.zeros(x.shape, dtype=bool)
    if saturate or (not fmt.has_inf and not fmt.has_nan):
        mag = np.where(ovf | isinf, maxc, mag)
        blown = np.zeros(x.shape, dtype=bool)
    else:
        mag = np.where(ovf & tz_like, maxc, mag)
        blown = (ovf & ~tz_like) | isinf
    code = mag.astype(_U)

    if fmt.signed:
        zero = (mag == 0) & np.bool_(fmt.has_zero)  # code 0 of E8M0-like formats is not 0
        signbit = neg & ~(zero & ~np.bool_(fmt.has_negative_zero))
        code = code | (signbit.astype(_U) << _U(fmt.magnitude_bits))
    else:
        negative = neg & (x != 0) & ~isnan
        if negative.any():
            # magnitudes that round to zero become +0; anything else has no code
            hard = negative & ((mag != 0) | np.bool_(not fmt.has_zero))
            if saturate:
                code = np.where(negative, _U(0), code)
            else:
                code = np.where(hard, _U(fmt.nan_code), np.where(negative, _U(0), code))

    if blown.any():
        if fmt.has_inf:
            inf = _U(fmt.inf_code)
            signed_inf = inf | (neg.astype(_U) << _U(fmt.magnitude_bits)) if fmt.signed else inf
            if not fmt.signed and fmt.has_nan:  # -inf has no code; without a NaN,
                signed_inf = np.where(neg, _U(fmt.nan_code), inf)  # negatives were refused
            code = np.where(blown, signed_inf, code)
        else:
            code = np.where(blown, _signed_nan(fmt, neg), code)
    if isnan.any():
        code = np.where(isnan, _signed_nan(fmt, neg) if fmt.has_nan else _U(0), code)
    return code.astype(fmt.code_dtype)


def _signed_nan(fmt: FloatFields, neg: np.ndarray) -> np.ndarray:
    """The NaN code for each element, with its sign where the NaN code has one (IEEE and
    S.1..1 NaNs keep the sign of the NaN or overflow, as ml_dtypes and numpy do)."""
    nan_code = _U(fmt.nan_code)
    if fmt.signed and fmt.nan in (NaN.HIGH, NaN.IEEE):
        return nan_code | (neg.astype(_U) << _U(fmt.magnitude_bits))
    return np.broadcast_to(nan_code, neg.shape)


def _tiny_threshold(sig: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """ceil(sig * 2**(64 - shift)) for gaps wider than 2**62 units (saturating at 2**64-1)."""
    k = shift - 64
    out = np.zeros(sig.shape, dtype=_U)
    left = k <= 0
    out[left] = sig[left] << (-k[left]).astype(_U)
    mid = (k > 0) & (k < 64)
    kk = k[mid].astype(_U)
    out[mid] = (sig[mid] + ((_ONE << kk) - _ONE)) >> kk
    far = k >= 64
    out[far] = (sig[far] != 0).astype(_U)
    return out


def _patch_no_subnormal_zone(
    fmt: FloatFields,
    x: np.ndarray,
    neg: np.ndarray,
    mag: np.ndarray,
    mode: Rounding,
    rbits: np.ndarray | None,
) -> np.ndarray:
    """Values below the smallest positive of a format without subnormals.

    Its neighbours there are 0 (when the format has a zero) and the smallest positive
    value, which is not a power-of-two multiple of the code grid, so this is decided by
    comparing with the midpoint.
    """
    tiny = fmt.smallest_positive
    ax = np.abs(x)
    zone = ax < tiny
    if not zone.any():
        return mag
    if not fmt.has_zero:
        return np.where(zone, 0, mag)
    nonzero = ax != 0
    if mode is Rounding.NEAREST_EVEN:
        up = ax > tiny / 2
    elif mode is Rounding.NEAREST_AWAY:
        up = ax >= tiny / 2
    elif mode is Rounding.TOWARD_ZERO:
        up = np.zeros(x.shape, dtype=bool)
    elif mode is Rounding.TOWARD_POSITIVE:
        up = nonzero & ~neg
    elif mode is Rounding.TOWARD_NEGATIVE:
        up = nonzero & neg
    else:
        assert rbits is not None
        from fractions import Fraction

        up = np.zeros(x.shape, dtype=bool)
        for i in np.flatnonzero(zone & nonzero):
            threshold = Fraction(float(ax[i])) / Fraction(tiny) * 2**64
            up[i] = int(rbits[i]) < threshold
    return np.where(zone, up.astype(np.int64), mag)
