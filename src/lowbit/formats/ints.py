"""Integer formats: two's complement ``intN`` and unsigned ``uintN``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lowbit._arrays import as_float64, check_codes
from lowbit.codecs import _numba as _fast
from lowbit.codecs.vectorised import _MODE_INDEX, as_float_input, check_nan_policy, prepare_random
from lowbit.enums import Rounding, as_rounding
from lowbit.errors import LowbitError, NaNPolicyError
from lowbit.formats.base import Format

_NUMPY_INTS = {"int8", "uint8", "int16", "int32", "uint16", "uint32"}
_ML_INTS = {"int2", "int4", "uint2", "uint4"}


@dataclass(frozen=True, kw_only=True)
class IntFormat(Format):
    """An integer format of ``nbits`` bits; codes are the two's complement bit patterns."""

    name: str
    nbits: int
    signed: bool = True
    description: str = field(default="", compare=False)

    kind = "int"

    def __post_init__(self) -> None:
        if not 1 <= self.nbits <= 32 or (self.signed and self.nbits < 2):
            raise LowbitError(f"invalid integer width {self.nbits} for {self.name!r}")

    @property
    def bits(self) -> int:
        return self.nbits

    @property
    def sign_bits(self) -> int:
        return 1 if self.signed else 0

    @property
    def max(self) -> float:
        return float((1 << (self.nbits - 1)) - 1 if self.signed else (1 << self.nbits) - 1)

    @property
    def min(self) -> float:
        return float(-(1 << (self.nbits - 1)) if self.signed else 0)

    @property
    def smallest_positive(self) -> float:
        return 1.0

    @property
    def smallest_normal(self) -> float:
        return 1.0

    @property
    def eps(self) -> float:
        return 1.0

    @property
    def finite_count(self) -> int:
        return 1 << self.nbits

    @property
    def ml_dtype(self) -> np.dtype | None:
        if self.name in _NUMPY_INTS:
            return np.dtype(self.name)
        if self.name in _ML_INTS:
            import ml_dtypes

            dt = getattr(ml_dtypes, self.name, None)
            return None if dt is None else np.dtype(dt)
        return None

    @property
    def ml_dtype_name(self) -> str | None:
        # int2/uint2/int4/uint4 are in ml_dtypes >= 0.5, the floor lowbit requires
        return self.name if self.name in _NUMPY_INTS | _ML_INTS else None

    @property
    def torch_dtype_name(self) -> str | None:
        return self.name if self.name in ("int8", "uint8", "int16", "int32") else None

    def values(self) -> np.ndarray:
        if self.nbits > 16:
            raise LowbitError(f"{self.name} has too many values to list")
        return np.arange(self.min, self.max + 1, dtype=np.float64)

    def encode(
        self,
        x: Any,
        *,
        rounding: str = "nearest_even",
        saturate: bool | None = None,
        seed: Any = None,
        random_bits: Any = None,
        nan: str = "raise",
    ) -> np.ndarray:
        """Round to integers and return the two's complement codes.

        Args:
            rounding: as for float formats; stochastic rounds away from zero with
                probability exactly the fractional part of ``|x|``
                (iff ``random_bits < frac(|x|) * 2**64``).
            saturate: True or None (default) clamps to [min, max]; False wraps modulo
                2**bits as a C cast (and ml_dtypes) does.
            nan: NaN input: ``"raise"`` (default) or ``"zero"``.
        """
        mode = as_rounding(rounding)
        check_nan_policy(nan)
        done = _encode_compiled(self, x, mode, saturate, seed, random_bits, nan)
        if done is not None:
            return done
        x = as_float64(x)
        isnan = np.isnan(x)
        if isnan.any():
            if nan == "raise":
                raise NaNPolicyError(
                    f"input contains NaN and {self.name} has no NaN code; pass nan='zero'"
                )
            x = np.where(isnan, 0.0, x)
        r = round_to_integer(x, mode, prepare_random(mode, x.shape, seed, random_bits))
        lo, hi = self.min, self.max
        if saturate is False:
            finite = np.isfinite(r)
            r = np.where(finite, r, np.where(r > 0, hi, lo))
            wrapped = np.mod(r, float(1 << self.nbits))
            codes = wrapped.astype(np.uint64)
        else:
            r = np.clip(r, lo, hi)
            codes = r.astype(np.int64).astype(np.uint64) & np.uint64((1 << self.nbits) - 1)
        return codes.astype(self.code_dtype)

    def decode(self, codes: Any, dtype: Any = np.float32) -> np.ndarray:
        """Values of two's complement codes, as ``dtype`` (float32 default; int dtypes work)."""
        c = check_codes(codes, self.bits, self.name).astype(np.int64)
        if self.signed:
            sign = np.int64(1 << (self.nbits - 1))
            c = (c ^ sign) - sign
        return c.astype(dtype)

    def to_signed(self, codes: Any) -> np.ndarray:
        """Codes as the integers they hold (int8/16/32)."""
        c = self.decode(codes, dtype=np.int64)
        width = 8 if self.nbits <= 8 else 16 if self.nbits <= 16 else 32
        return c.astype(f"int{width}" if self.signed else f"uint{width}")


def _encode_compiled(
    fmt: IntFormat, x: Any, mode: Rounding, saturate: bool | None, seed: Any, bits: Any, nan: str
) -> np.ndarray | None:
    """``IntFormat.encode`` by the compiled kernel (``lowbit.codecs._numba``), or None without one."""
    if not _fast.enabled():
        return None
    try:
        arr = as_float_input(x)
    except Exception:
        _fast.taken()  # without the kernels the numpy path's conversion raises instead
        raise
    if not _fast.use_kernels(arr.size):
        return None
    flat = np.ascontiguousarray(arr).reshape(-1)
    if flat.dtype not in (np.float32, np.float64):
        flat = flat.astype(np.float32)  # float16/bfloat16: exact
    rbits = prepare_random(mode, arr.shape, seed, bits)
    out = np.empty(flat.size, dtype=fmt.code_dtype)
    wrap = saturate is False
    if not _fast.encode_int(
        fmt, flat, _MODE_INDEX[mode], wrap, rbits, out, nan_check=nan == "raise"
    ):
        return None
    return out.reshape(arr.shape)


def round_to_integer(x: np.ndarray, mode: Rounding, rbits: np.ndarray | None) -> np.ndarray:
    """Round float64 values to integers (as float64) in any rounding mode, exactly.

    Works on magnitudes: ``|x| - floor(|x|)`` is exact in float64, where ``x - floor(x)``
    is not for x in (-1, 0) (-0.49999999999999994 would look like a tie).
    """
    finite = np.isfinite(x)
    ax = np.abs(np.where(finite, x, 0.0))
    afl = np.floor(ax)
    afrac = ax - afl  # exact
    inexact = afrac > 0
    if mode is Rounding.NEAREST_EVEN:
        away = (afrac > 0.5) | ((afrac == 0.5) & (np.mod(afl, 2) == 1))
    elif mode is Rounding.NEAREST_AWAY:
        away = afrac >= 0.5
    elif mode is Rounding.TOWARD_ZERO:
        away = np.zeros(x.shape, dtype=bool)
    elif mode is Rounding.TOWARD_POSITIVE:
        away = inexact & (x > 0)
    elif mode is Rounding.TOWARD_NEGATIVE:
        away = inexact & (x < 0)
    else:
        assert rbits is not None
        # as for float formats: away from zero iff rbits < r * 2**64, r = the fraction
        # of the gap from the neighbour nearer zero (so SR(-x) = -SR(x) for the same bits)
        away = inexact & (rbits.reshape(x.shape) < np.ceil(np.ldexp(afrac, 64)).astype(np.uint64))
    return np.where(finite, np.copysign(afl + away, x), x)
