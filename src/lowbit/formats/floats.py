"""Sign/exponent/mantissa float formats, declared by their layout; every property derived.

Name suffixes (the vocabulary ml_dtypes, torch and LLVM share): ``f`` = finite (no
infinities), ``n`` = NaN encoded specially (not IEEE's whole all-ones exponent),
``uz`` = unsigned zero (no -0; its code is the NaN). ``e4m3`` = 4 exponent bits and 3
trailing mantissa bits (the implicit leading bit and the sign are not counted).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import Any

import numpy as np

from lowbit._arrays import check_codes
from lowbit.codecs.vectorised import as_float_input, decode_float, decode_float_arith, encode_float
from lowbit.enums import Inf, NaN
from lowbit.errors import LowbitError
from lowbit.formats.base import Format

# Formats ml_dtypes / numpy have under the same name, and those torch has.
_NUMPY_NAMES = {"float16", "float32", "float64"}
_ML_DTYPES_NAMES = {
    "bfloat16",
    "float8_e4m3fn",
    "float8_e4m3",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e4m3b11fnuz",
    "float8_e3m4",
    "float8_e8m0fnu",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "float4_e2m1fn",
}
_TORCH_NAMES = {
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
}


@dataclass(frozen=True, kw_only=True)
class FloatFormat(Format):
    """A binary floating-point layout: ``[sign] exponent mantissa``.

    Args:
        name: canonical name.
        ebits: exponent field width (0 allowed: an all-subnormal format).
        mbits: trailing significand bits (never counting the sign or the implicit bit).
        bias: exponent bias; default ``2**(ebits-1) - 1`` (IEEE).
        signed: whether there is a sign bit.
        inf: where infinities live (:class:`~lowbit.Inf`).
        nan: where NaNs live (:class:`~lowbit.NaN`).
        subnormals: if False, the all-zeros exponent field is an ordinary binade
            (implicit leading 1) except that its all-zeros mantissa is zero; a format with
            no mantissa bits and no subnormals has no zero at all (OCP E8M0).
        container_bits: storage width if wider than the code (TF32 lives in 32 bits).
        description: one line for tables.
    """

    name: str
    ebits: int
    mbits: int
    bias: int = None  # type: ignore[assignment]  # derived in __post_init__
    signed: bool = True
    inf: Inf = Inf.IEEE
    nan: NaN = NaN.IEEE
    subnormals: bool = True
    container: int | None = None
    description: str = field(default="", compare=False)

    kind = "float"

    def __post_init__(self) -> None:
        object.__setattr__(self, "inf", Inf(self.inf))
        object.__setattr__(self, "nan", NaN(self.nan))
        if self.bias is None:
            object.__setattr__(self, "bias", (1 << (self.ebits - 1)) - 1 if self.ebits else 0)
        problems = []
        if not 0 <= self.ebits <= 11:
            problems.append(f"ebits={self.ebits} (allowed 0..11)")
        if not 0 <= self.mbits <= 52:
            problems.append(f"mbits={self.mbits} (allowed 0..52)")
        if self.ebits + self.mbits < 1:
            problems.append("a format needs at least one exponent or mantissa bit")
        if self.nan is NaN.NEG_ZERO and not self.signed:
            problems.append("nan='neg_zero' needs a sign bit")
        if self.nan is NaN.NEG_ZERO and not self.subnormals and self.mbits == 0:
            problems.append("nan='neg_zero' needs a zero (subnormals or a mantissa bit)")
        if (self.inf is Inf.IEEE or self.nan is NaN.IEEE) and self.ebits == 0:
            problems.append("IEEE-style inf/NaN need an exponent field")
        if self.inf is Inf.IEEE and self.nan not in (NaN.IEEE, NaN.NONE):
            problems.append("IEEE infinities go with IEEE NaNs (or none)")
        if self.nan is NaN.IEEE and self.mbits == 0:
            problems.append("IEEE NaNs need a mantissa bit (use nan='none' or 'high')")
        if self.inf is Inf.IEEE and self.nan is NaN.NONE and self.mbits > 0:
            # the all-ones exponent with a non-zero mantissa would mean nothing
            problems.append("IEEE infinities without NaNs need mbits=0")
        if self.inf is Inf.HIGH and self.nan is NaN.IEEE:
            problems.append("inf='high' goes with nan 'high', 'neg_zero' or 'none'")
        if problems:
            raise LowbitError(f"invalid float layout {self.name!r}: " + "; ".join(problems))
        if self.max_code_magnitude < 0 or (self.emin - self.mbits) < -1074:
            raise LowbitError(f"invalid float layout {self.name!r}: no finite values or too wide")
        top = self.exact_magnitude(self.max_code_magnitude)
        if top <= 0 or top >= 2**1024:
            raise LowbitError(
                f"invalid float layout {self.name!r}: its largest finite value must be "
                "positive and below float64's range (2**1024)"
            )

    # ---- layout --------------------------------------------------------------------

    @property
    def sign_bits(self) -> int:
        return 1 if self.signed else 0

    @property
    def bits(self) -> int:
        return self.sign_bits + self.ebits + self.mbits

    @property
    def magnitude_bits(self) -> int:
        return self.ebits + self.mbits

    @property
    def container_bits(self) -> int:
        return self.container or super().container_bits

    @property
    def emin(self) -> int:
        """Exponent of the lowest binade in the code formula (subnormals share it)."""
        return 1 - self.bias if self.subnormals else -self.bias

    @property
    def has_zero(self) -> bool:
        return self.subnormals or self.mbits > 0

    @property
    def has_inf(self) -> bool:  # type: ignore[override]
        return self.inf is not Inf.NONE

    @property
    def has_nan(self) -> bool:  # type: ignore[override]
        return self.nan is not NaN.NONE

    @property
    def has_negative_zero(self) -> bool:  # type: ignore[override]
        return self.signed and self.has_zero and self.nan is not NaN.NEG_ZERO

    # ---- special codes (magnitude = code without the sign bit) ---------------------

    @cached_property
    def _top_specials(self) -> tuple[int, int | None]:
        """(max finite magnitude code, inf magnitude code or None)."""
        top = (1 << self.magnitude_bits) - 1
        all_ones_exp = ((1 << self.ebits) - 1) << self.mbits
        inf_code = None
        if self.inf is Inf.IEEE:
            return all_ones_exp - 1, all_ones_exp
        if self.nan is NaN.IEEE:  # IEEE NaNs without infinities: mantissa 0 stays finite
            return all_ones_exp, None
        limit = top
        if self.nan is NaN.HIGH:
            limit -= 1
        if self.inf is Inf.HIGH:
            inf_code = limit
            limit -= 1
        return limit, inf_code

    @property
    def max_code_magnitude(self) -> int:
        """Magnitude code of the largest finite value."""
        return self._top_specials[0]

    @property
    def inf_code(self) -> int | None:
        """Code of +inf, or None."""
        return self._top_specials[1]

    @property
    def nan_code(self) -> int | None:
        """The canonical NaN code (what encode writes for a NaN), or None."""
        if self.nan is NaN.NONE:
            return None
        if self.nan is NaN.NEG_ZERO:
            return 1 << (self.bits - 1)
        if self.nan is NaN.HIGH:
            return (1 << self.bits) - 1 if not self.signed else (1 << self.magnitude_bits) - 1
        # IEEE: quiet NaN, positive, top mantissa bit set (what numpy and ml_dtypes produce)
        return (((1 << self.ebits) - 1) << self.mbits) | (1 << max(self.mbits - 1, 0))

    def is_nan_code(self, code: int) -> bool:
        """Whether a code (with sign) is a NaN."""
        mag = code & ((1 << self.magnitude_bits) - 1)
        neg = self.signed and code >> self.magnitude_bits
        if self.nan is NaN.NEG_ZERO:
            return bool(neg) and mag == 0
        if self.nan is NaN.HIGH:
            return mag == (1 << self.magnitude_bits) - 1
        if self.nan is NaN.IEEE:
            return mag > ((1 << self.ebits) - 1) << self.mbits
        return False

    def exact_magnitude(self, mag: int) -> Fraction:
        """Exact value of a finite magnitude code (no sign)."""
        e, f = mag >> self.mbits, mag & ((1 << self.mbits) - 1)
        if e == 0 and self.subnormals:
            return Fraction(f) * Fraction(2) ** (1 - self.bias - self.mbits)
        if e == 0 and f == 0 and self.mbits > 0:
            return Fraction(0)
        return Fraction((1 << self.mbits) + f) * Fraction(2) ** (e - self.bias - self.mbits)

    # ---- derived properties --------------------------------------------------------

    @property
    def max(self) -> float:
        return float(self.exact_magnitude(self.max_code_magnitude))

    @property
    def min(self) -> float:
        return -self.max if self.signed else self.smallest_positive if not self.has_zero else 0.0

    @property
    def smallest_positive(self) -> float:
        return float(self.exact_magnitude(0 if not self.has_zero else 1))

    @property
    def smallest_normal(self) -> float:
        if self.subnormals:
            return (
                float(self.exact_magnitude(1 << self.mbits))
                if self.ebits
                else self.smallest_positive
            )
        return self.smallest_positive

    @property
    def eps(self) -> float:
        # the code grid's spacing at 1.0: 2**-mbits, unless 1.0 lies below the lowest
        # binade (all-subnormal layouts, large negative emin), where the spacing is fixed
        return 2.0 ** (max(0, self.emin) - self.mbits)

    @property
    def finite_count(self) -> int:
        per_sign = self.max_code_magnitude + 1
        count = per_sign * (2 if self.signed else 1)
        if self.nan is NaN.NEG_ZERO:
            count -= 1
        return count

    @property
    def ml_dtype(self) -> np.dtype | None:
        if self.name in _NUMPY_NAMES:
            return np.dtype(self.name)
        if self.name in _ML_DTYPES_NAMES:
            import ml_dtypes

            dt = getattr(ml_dtypes, self.name, None)
            return None if dt is None else np.dtype(dt)
        return None

    @property
    def ml_dtype_name(self) -> str | None:
        # every name in _ML_DTYPES_NAMES is in ml_dtypes >= 0.5, the floor lowbit requires
        return self.name if self.name in _NUMPY_NAMES | _ML_DTYPES_NAMES else None

    @property
    def torch_dtype_name(self) -> str | None:
        return self.name if self.name in _TORCH_NAMES else None

    @cached_property
    def _table64(self) -> np.ndarray:
        """Value of every code (formats of at most 16 bits), float64."""
        return decode_float_arith(self, np.arange(1 << self.bits, dtype=np.uint64))

    def values(self) -> np.ndarray:
        if self.bits > 16:
            raise LowbitError(f"{self.name} has too many values to list ({self.finite_count})")
        t = self._table64
        return np.unique(t[np.isfinite(t)] + 0.0)

    # ---- codecs --------------------------------------------------------------------

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
        """Round ``x`` once, from its exact value, to this format's codes.

        Args:
            x: values: a scalar, list, numpy array (any float dtype) or torch tensor.
            rounding: a :class:`~lowbit.Rounding` (nearest_even, nearest_away, toward_zero,
                toward_positive, toward_negative, stochastic).
            saturate: True clamps overflow (and infinities) to ±max, the OCP "SAT" mode;
                False/None does what the format's specification says: inf where it has one,
                else NaN, else (formats with neither, like FP4/FP6) ±max. Rounding toward
                zero never overflows to inf (IEEE 754 §7.4).
            seed: seed or ``numpy.random.Generator`` for stochastic rounding.
            random_bits: uint64 array (broadcast to x) used instead of a seed: a value
                at fraction r of the gap between its neighbours rounds up iff
                ``random_bits < r * 2**64``; so the probability is exactly r.
            nan: a NaN input becomes the NaN code where the format has one; for formats
                without, ``"raise"`` (default) raises and ``"zero"`` writes +0.

        Returns:
            Unsigned integer codes (uint8/16/32/64, the smallest that fits), x's shape.

        Raises:
            NaNPolicyError: NaN input for a format without NaN, under ``nan="raise"``.
        """
        return encode_float(
            self,
            as_float_input(x),
            rounding=rounding,
            saturate=bool(saturate),
            seed=seed,
            random_bits=random_bits,
            nan=nan,
        )

    def decode(self, codes: Any, dtype: Any = np.float32) -> np.ndarray:
        """Values of ``codes`` (any integer array), as ``dtype`` (default float32)."""
        arr = check_codes(codes, self.bits, self.name, widen=False)
        return decode_float(self, arr, np.dtype(dtype))

    def split_bits(self, code: int) -> tuple[str, str, str]:
        """The code's sign, exponent and mantissa fields as binary strings."""
        s = format(code >> self.magnitude_bits, "b") if self.signed else ""
        e = (
            format((code >> self.mbits) & ((1 << self.ebits) - 1), f"0{self.ebits}b")
            if self.ebits
            else ""
        )
        m = format(code & ((1 << self.mbits) - 1), f"0{self.mbits}b") if self.mbits else ""
        return s, e, m

    def __repr__(self) -> str:
        return (
            f"FloatFormat(name={self.name!r}, ebits={self.ebits}, mbits={self.mbits}, "
            f"bias={self.bias}, signed={self.signed}, inf={self.inf.value!r}, "
            f"nan={self.nan.value!r}, subnormals={self.subnormals})"
        )
