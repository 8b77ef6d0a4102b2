"""Vectorised float codecs in numpy, on the integer bit fields of float64.

Encoding rounds each input once, from its exact value: a float64 ``x`` is
``sig * 2**ex`` with an integer ``sig < 2**53``; the target grid near ``x`` has spacing
``2**q`` (``q = max(floor(log2|x|), emin) - mbits``), so the rounded magnitude is the
integer ``n = round(sig / 2**(q - ex))`` and the magnitude code is
``((max(floor(log2|x|), emin) + bias - 1) << mbits) + n``: a carry out of the mantissa
moves into the exponent field by itself. Overflow, infinities, NaN and the sign are
patched afterwards. float32, float16 and bfloat16 inputs widen to float64 exactly, so
the same code serves every input dtype with a single rounding.

Work is done in chunks that fit the CPU cache. ``lowbit.codecs._numba`` (numba) replaces the
chunk loop with a compiled one when numba is installed; both are tested bit for bit
against ``lowbit.formats.reference``.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from lowbit._arrays import _from_torch, as_float64, check_random_bits, random_bits
from lowbit.codecs import _numba as _fast
from lowbit.codecs._common import FloatFields, nan_error, negative_error, value_table
from lowbit.enums import Inf, NaN, Rounding, as_rounding
from lowbit.errors import LowbitError

CHUNK = 1 << 15
_U = np.uint64
_ONE = np.uint64(1)
_MASK52 = np.uint64((1 << 52) - 1)
_IMPLICIT = np.uint64(1 << 52)

_BF16 = np.dtype(ml_dtypes.bfloat16)
_NATIVE_INPUTS = (np.dtype(np.float16), _BF16, np.dtype(np.float32), np.dtype(np.float64))

_MODE_INDEX = {
    Rounding.NEAREST_EVEN: 0,
    Rounding.NEAREST_AWAY: 1,
    Rounding.TOWARD_ZERO: 2,
    Rounding.TOWARD_POSITIVE: 3,
    Rounding.TOWARD_NEGATIVE: 4,
    Rounding.STOCHASTIC: 5,
}


def check_nan_policy(nan: str) -> str:
    if nan not in ("raise", "zero"):
        raise LowbitError(f"unknown NaN policy {nan!r}; allowed: 'raise', 'zero'")
    return nan


def prepare_random(
    mode: Rounding, shape: tuple[int, ...], seed: Any, bits: Any
) -> np.ndarray | None:
    """The uint64 random bits stochastic rounding uses (None for other modes)."""
    if mode is not Rounding.STOCHASTIC:
        return None
    if bits is not None:
        return np.ascontiguousarray(check_random_bits(bits, shape)).reshape(-1)
    return random_bits(shape, seed).reshape(-1)


def as_float_input(x: Any) -> np.ndarray:
    """``x`` as an array the encoder reads: float16/bfloat16/float32/float64 kept as they
    are (every value widens to float64 exactly, in a register or per chunk), anything
    else converted by ``as_float64``."""
    arr = _from_torch(x)
    if isinstance(arr, np.ndarray) and arr.dtype in _NATIVE_INPUTS:
        return arr
    return as_float64(arr)


def encode_float(
    fmt: FloatFields,
    x: np.ndarray,
    *,
    rounding: str | Rounding,
    saturate: bool,
    seed: Any,
    random_bits: Any,
    nan: str,
) -> np.ndarray:
    """Codes of ``x`` (a float16/bfloat16/float32/float64 array) in ``fmt``; see
    ``FloatFormat.encode``."""
    mode = as_rounding(rounding)
    check_nan_policy(nan)
    shape = x.shape
    flat = np.ascontiguousarray(x).reshape(-1)
    nan_check = not fmt.has_nan and nan == "raise"
    neg_check = not fmt.signed and not fmt.has_nan and not saturate
    if fmt.ebits == 11 and fmt.mbits == 52 and fmt.signed and fmt.bias == 1023:
        wide = _widen(flat)
        if saturate:  # the only rounding float64 input needs: the OCP SAT clamp of ±inf
            wide = np.clip(wide, -fmt.max, fmt.max)
        return wide.view(_U).reshape(shape).copy()  # float64 itself: exact
    rbits = prepare_random(mode, shape, seed, random_bits)
    out = np.empty(flat.size, dtype=fmt.code_dtype)
    kernel_input = flat if flat.dtype != np.float16 and flat.dtype != _BF16 else None
    if kernel_input is None and _fast.enabled():
        kernel_input = flat.astype(np.float32)  # exact; the kernel reads float32
    # the kernel checks NaN and sign on the fly (raising the same errors)
    if kernel_input is not None and _fast.encode_float(
        fmt,
        kernel_input,
        _MODE_INDEX[mode],
        saturate,
        rbits,
        out,
        nan_check=nan_check,
        neg_check=neg_check,
    ):
        return out.reshape(shape)
    from lowbit.codecs import _numpy_fast

    if rbits is None:  # code tables and exact casts (float16/bfloat16/float32 input)
        quick = _numpy_fast.encode(
            fmt, flat, mode, saturate, nan_check=nan_check, neg_check=neg_check
        )
        if quick is not None:
            return quick.reshape(shape)
    return _encode_general(fmt, flat, mode, saturate, rbits, nan_check, neg_check).reshape(shape)


def _encode_general(
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
            fmt, _widen(flat[sl]), mode, saturate, None if rbits is None else rbits[sl]
        )
    return out


def _widen(x: np.ndarray) -> np.ndarray:
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


def decode_float_arith(fmt: FloatFields, codes: np.ndarray) -> np.ndarray:
    """Values of codes (uint64 array) as float64, by arithmetic on the bit fields."""
    codes = codes.astype(_U, copy=False)
    m, mb = fmt.mbits, fmt.magnitude_bits
    mag = codes & _U((1 << mb) - 1)
    e = (mag >> _U(m)).astype(np.int64)
    f = (mag & _U((1 << m) - 1)).astype(np.float64)
    if fmt.subnormals:
        sub = e == 0
        significand = np.where(sub, f, f + float(1 << m))
        exponent = np.where(sub, 1 - fmt.bias - m, e - fmt.bias - m)
        val = np.ldexp(significand, exponent)
    else:
        val = np.ldexp(f + float(1 << m), e - fmt.bias - m)
        if m > 0:
            val = np.where(mag == 0, 0.0, val)
    if fmt.signed:
        neg = (codes >> _U(mb)) != 0
        val = np.where(neg, -val, val)
    if fmt.inf_code is not None:
        val = np.where(mag == _U(fmt.inf_code), np.copysign(np.inf, val), val)
    if fmt.nan is NaN.IEEE:
        isnan = mag > _U(((1 << fmt.ebits) - 1) << m)
    elif fmt.nan is NaN.HIGH:
        isnan = mag == _U((1 << mb) - 1)
    elif fmt.nan is NaN.NEG_ZERO:
        isnan = codes == _U(1 << (fmt.bits - 1))
    else:
        isnan = None
    if isnan is not None:  # the quiet NaN, with the code's sign bit (as ml_dtypes decodes)
        val = np.where(isnan, np.copysign(np.nan, val) if fmt.signed else np.nan, val)
    return val


def decode_float(fmt: FloatFields, codes: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Values of validated codes (any integer dtype) in ``dtype``."""
    fast = _fast.decode_float(fmt, codes, dtype)
    if fast is not None:
        return fast
    if fmt.bits <= 16:
        from lowbit.codecs import _numpy_fast

        if codes.dtype not in (np.uint8, np.uint16):
            codes = codes.astype(np.intp)
        return _numpy_fast.decode(fmt, codes, value_table(fmt, dtype))
    layout = (fmt.ebits, fmt.mbits, fmt.bias, fmt.signed, fmt.inf, fmt.nan, fmt.subnormals)
    if layout == (8, 23, 127, True, Inf.IEEE, NaN.IEEE, True):
        return codes.astype(np.uint32).view(np.float32).astype(dtype, copy=False)
    if layout == (11, 52, 1023, True, Inf.IEEE, NaN.IEEE, True):
        return codes.astype(np.uint64).view(np.float64).astype(dtype, copy=False)
    return decode_float_arith(fmt, codes).astype(dtype, copy=False)
