"""The protocol every number format follows: name, bits, encode, decode, round, properties."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from lowbit._arrays import as_float64, code_dtype


class Format(ABC):
    """A number format: a set of values, each with a ``bits``-wide code.

    Subclasses: :class:`~lowbit.FloatFormat` (sign/exponent/mantissa layouts),
    :class:`~lowbit.IntFormat` (two's complement and unsigned integers) and
    :class:`~lowbit.ValueSetFormat` (an explicit list of values such as NF4).
    """

    name: str
    kind: str

    @property
    @abstractmethod
    def bits(self) -> int:
        """Width of one code in bits (what it costs when packed)."""

    @abstractmethod
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
        """Convert values to codes (unsigned integers holding the bit patterns)."""

    @abstractmethod
    def decode(self, codes: Any, dtype: Any = np.float32) -> np.ndarray:
        """Convert codes back to values."""

    @abstractmethod
    def values(self) -> np.ndarray:
        """Every finite value, ascending, as float64 (signed zeros collapsed)."""

    @property
    @abstractmethod
    def max(self) -> float:
        """Largest finite value."""

    @property
    @abstractmethod
    def min(self) -> float:
        """Most negative finite value (0 or the smallest value for unsigned formats)."""

    @property
    @abstractmethod
    def smallest_positive(self) -> float:
        """Smallest value above zero (a subnormal where the format has them)."""

    @property
    @abstractmethod
    def smallest_normal(self) -> float:
        """Smallest positive value at full precision (1 for integers)."""

    @property
    @abstractmethod
    def eps(self) -> float:
        """Gap between 1.0 and the next larger value (IEEE "machine epsilon")."""

    @property
    @abstractmethod
    def finite_count(self) -> int:
        """How many codes hold a finite value (both zeros counted where they exist)."""

    has_inf: bool = False
    has_nan: bool = False
    has_negative_zero: bool = False

    # ---- shared derived properties -------------------------------------------------

    @property
    def code_dtype(self) -> np.dtype:
        """The unsigned dtype ``encode`` returns."""
        return code_dtype(self.bits)

    @property
    def container_bits(self) -> int:
        """Bits one value occupies unpacked, in its natural container (8, 16, 32 or 64)."""
        return int(self.code_dtype.itemsize * 8)

    @property
    def container_bytes(self) -> int:
        """Bytes one value occupies unpacked."""
        return self.container_bits // 8

    @property
    def packed_bits(self) -> int:
        """Bits one value occupies when codes are bit-packed (lowbit.codecs.packing)."""
        return self.bits

    @property
    def digits(self) -> float:
        """Decimal digits of precision: -log10(eps / 2), the relative spacing at 1.0."""
        return -math.log10(self.eps / 2)

    @property
    def dynamic_range_binades(self) -> float:
        """log2(max / smallest_positive): how many powers of two the format spans."""
        # two logs, not log2 of the quotient: float64's max / 2**-1074 overflows to inf
        return math.log2(self.max) - math.log2(self.smallest_positive)

    @property
    def ml_dtype(self) -> np.dtype | None:
        """The matching numpy / ml_dtypes dtype, or None."""
        return None

    @property
    def ml_dtype_name(self) -> str | None:
        """The name of :attr:`ml_dtype` (``str(self.ml_dtype)``), or None, without importing
        ml_dtypes (whose import is most of a cold start)."""
        return None

    @property
    def torch_dtype_name(self) -> str | None:
        """Name of the matching ``torch`` dtype (``getattr(torch, name)``), or None."""
        return None

    def round(self, x: Any, **kwargs: Any) -> Any:
        """Round ``x`` to the nearest representable values (keyword args as ``encode``).

        Returns the values in ``x``'s float dtype (float64 for Python scalars and lists).
        """
        arr = np.asarray(x) if not _is_torch(x) else x
        dtype = arr.dtype if getattr(arr, "dtype", None) is not None else np.float64
        if _is_torch(x):
            import torch

            out = self.decode(self.encode(x, **kwargs), dtype=np.float64)
            return torch.from_numpy(out).to(x.dtype)
        if np.dtype(dtype).kind != "f":
            dtype = np.float64
        codes = self.encode(as_float64(arr), **kwargs)
        return self.decode(codes, dtype=np.float64).astype(dtype)

    def describe(self) -> dict[str, Any]:
        """All the properties as a JSON-able dict."""
        return {
            "name": self.name,
            "kind": self.kind,
            "bits": self.bits,
            "sign_bits": getattr(self, "sign_bits", None),
            "exponent_bits": getattr(self, "ebits", None),
            "mantissa_bits": getattr(self, "mbits", None),
            "bias": getattr(self, "bias", None),
            "max": self.max,
            "min": self.min,
            "smallest_normal": self.smallest_normal,
            "smallest_positive": self.smallest_positive,
            "eps": self.eps,
            "digits": round(self.digits, 3),
            "dynamic_range_binades": round(self.dynamic_range_binades, 3),
            "finite_count": self.finite_count,
            "has_inf": self.has_inf,
            "has_nan": self.has_nan,
            "has_negative_zero": self.has_negative_zero,
            "container_bytes": self.container_bytes,
            "packed_bits": self.packed_bits,
            "ml_dtypes": self.ml_dtype_name,
            "torch": self.torch_dtype_name,
        }

    def __str__(self) -> str:
        return self.name


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")
