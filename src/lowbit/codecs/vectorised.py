"""Vectorised float codecs in numpy: the entry points the formats call.

Encoding takes the first path that applies, each giving the same codes: the compiled
kernels (``lowbit.codecs._numba``, where numba is installed and the array is large
enough to be worth loading it), then the numpy path's code tables and exact casts
(``lowbit.codecs._numpy_fast``), then the general loop (``lowbit.codecs._general``:
single rounding on the integer bit fields of float64, every mode and input dtype).
All are tested bit for bit against ``lowbit.formats.reference``. Decoding is a lookup
in the value table for formats of at most 16 bits, arithmetic on the bit fields above.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lowbit._arrays import _from_torch, as_float64, check_random_bits, is_bfloat16, random_bits
from lowbit.codecs import _general, _numpy_fast
from lowbit.codecs import _numba as _fast
from lowbit.codecs._common import FloatFields, value_table
from lowbit.enums import Inf, NaN, Rounding, as_rounding
from lowbit.errors import LowbitError

_U = np.uint64

_NATIVE_INPUTS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))  # + bfloat16

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
    if isinstance(arr, np.ndarray) and (arr.dtype in _NATIVE_INPUTS or is_bfloat16(arr.dtype)):
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
        wide = _general.widen(flat)
        if saturate:  # the only rounding float64 input needs: the OCP SAT clamp of ±inf
            wide = np.clip(wide, -fmt.max, fmt.max)
        return wide.view(_U).reshape(shape).copy()  # float64 itself: exact
    rbits = prepare_random(mode, shape, seed, random_bits)
    out = np.empty(flat.size, dtype=fmt.code_dtype)
    kernel_input = flat if flat.dtype != np.float16 and not is_bfloat16(flat.dtype) else None
    if kernel_input is None and _fast.use_kernels(flat.size):
        kernel_input = flat.astype(np.float32)  # exact; the kernel reads float32
    # the kernel checks NaN and sign on the fly (raising the same errors); where the numpy
    # path has a fast route for float32 input too, the faster of the two on this machine runs
    numpy_path = None
    if rbits is None and kernel_input is flat and _numpy_fast.applies(fmt, flat.dtype, mode):

        def numpy_path(s: np.ndarray) -> Any:
            return _numpy_fast.encode(fmt, s, mode, saturate, nan_check=False, neg_check=False)

    if kernel_input is not None and _fast.encode_float(
        fmt,
        kernel_input,
        _MODE_INDEX[mode],
        saturate,
        rbits,
        out,
        nan_check=nan_check,
        neg_check=neg_check,
        numpy_path=numpy_path,
    ):
        return out.reshape(shape)
    if rbits is None:  # code tables and exact casts (float16/bfloat16/float32 input)
        quick = _numpy_fast.encode(
            fmt, flat, mode, saturate, nan_check=nan_check, neg_check=neg_check
        )
        if quick is not None:
            return quick.reshape(shape)
    return _general.encode_general(fmt, flat, mode, saturate, rbits, nan_check, neg_check).reshape(
        shape
    )


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
    numpy_path = None
    if fmt.bits <= 16:

        def numpy_path(c: np.ndarray) -> np.ndarray:
            return _numpy_fast.decode(fmt, c, value_table(fmt, dtype))

    fast = _fast.decode_float(fmt, codes, dtype, numpy_path)
    if fast is not None:
        return fast
    if fmt.bits <= 16:
        if codes.dtype not in (np.uint8, np.uint16):
            codes = codes.astype(np.intp)
        return _numpy_fast.decode(fmt, codes, value_table(fmt, dtype))
    layout = (fmt.ebits, fmt.mbits, fmt.bias, fmt.signed, fmt.inf, fmt.nan, fmt.subnormals)
    if layout == (8, 23, 127, True, Inf.IEEE, NaN.IEEE, True):
        return codes.astype(np.uint32).view(np.float32).astype(dtype, copy=False)
    if layout == (11, 52, 1023, True, Inf.IEEE, NaN.IEEE, True):
        return codes.astype(np.uint64).view(np.float64).astype(dtype, copy=False)
    return decode_float_arith(fmt, codes).astype(dtype, copy=False)
