"""OCP Microscaling (MX) block formats: 32 elements share one power-of-two E8M0 scale.

OCP MX v1.0 §5 defines the concrete formats and §6.3 the conversion used here (as
microxcaling and gfloat implement it):

* shared scale ``X = 2**(floor(log2(amax)) - emax_elem)``, clamped to the E8M0 range
  ``[2**-127, 2**127]`` (an all-zero block gets the smallest scale, ``2**-127``), where
  ``emax_elem = floor(log2(max normal of the element format))``;
* elements ``RNE(v / X)`` in the element format, clamped to ± its max normal (which the
  floor in the scale rule can make necessary: ``v / X`` reaches up to ``2**(emax+1)``).

MXINT8's element is an 8-bit two's complement integer with an implicit scale of
``2**-6`` (values -2 .. 1 + 63/64, emax 0). lowbit stores it as an ``int8`` code with
the quantization scale ``X * 2**-6`` (``QuantizedTensor.scale``); the E8M0 byte written
by ``to_arrays`` is the code of ``X``. The full two's complement range (code -128 =
-2.0) is used, as gfloat does.

Storage: an E8M0 byte per 32 elements, so MXFP4 costs 4.25 bits per value, MXFP6 6.25,
MXFP8 and MXINT8 8.25.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lowbit.errors import LowbitError
from lowbit.formats.base import Format

__all__ = [
    "BLOCK",
    "E8M0_MAX_EXP",
    "E8M0_MIN_EXP",
    "MXFormat",
    "e8m0_codes",
    "e8m0_exponents",
    "is_mx_name",
    "scale_values",
    "shared_exponent",
]

BLOCK = 32
E8M0_MIN_EXP = -127
E8M0_MAX_EXP = 127


@dataclass(frozen=True, kw_only=True)
class MXFormat:
    """An OCP MX block format (MX v1.0 §5): 32 elements of ``element`` share one ``scale``.

    The concrete formats are declared in :mod:`lowbit.formats.catalog` (``MX_FORMATS``).

    Attributes:
        name: canonical name (``mxfp4``, ``mxfp8_e4m3``, ...).
        element: the element format (``int8`` for MXINT8).
        scale: the shared scale's format (E8M0, ``float8_e8m0fnu``).
        int_shift: MXINT8's implicit element scale: element value = code * 2**-int_shift.
        description: one line for listings.
    """

    name: str
    element: Format
    scale: Format
    int_shift: int = 0
    description: str = ""

    @property
    def emax_elem(self) -> int:
        """``floor(log2(largest element value))`` (MX v1.0 §6.3), exactly (``frexp``).

        8 for E4M3 (448), 15 for E5M2, 4 for E3M2, 2 for E2M3 and E2M1, 0 for MXINT8
        (1 + 63/64, the int8 maximum times ``2**-int_shift``).
        """
        return math.frexp(math.ldexp(float(self.element.max), -self.int_shift))[1] - 1

    @property
    def block_size(self) -> int:
        return BLOCK

    @property
    def bits(self) -> int:
        """Element bits."""
        return self.element.bits

    @property
    def bits_per_value(self) -> float:
        """Element bits plus the scale's bits shared by 32 values."""
        return self.bits + self.scale.bits / BLOCK


def is_mx_name(name: str) -> bool:
    """Whether ``name`` names an MX block format (or a close misspelling of one)."""
    return isinstance(name, str) and name.strip().lower().replace("-", "_").startswith("mx")


def shared_exponent(amax: np.ndarray, emax_elem: int) -> np.ndarray:
    """``floor(log2(amax)) - emax_elem`` clamped to [-127, 127] (int32), exactly.

    ``frexp`` gives the exponent without the rounding of ``log2``; amax = 0 (an all-zero
    block) gives -127.
    """
    a = np.asarray(amax, dtype=np.float64)
    _, e = np.frexp(a)  # a = m * 2**e, 0.5 <= m < 1, so floor(log2 a) = e - 1
    exp = e.astype(np.int64) - 1 - emax_elem
    exp = np.where(a > 0, exp, E8M0_MIN_EXP)
    return np.clip(exp, E8M0_MIN_EXP, E8M0_MAX_EXP).astype(np.int32)


def e8m0_codes(scale_exp: np.ndarray) -> np.ndarray:
    """E8M0 byte of ``2**scale_exp`` (biased exponent, bias 127); NaN scales -> 0xFF."""
    return (np.asarray(scale_exp).astype(np.int64) + 127).astype(np.uint8)


def e8m0_exponents(codes: np.ndarray) -> np.ndarray:
    """Exponents of E8M0 bytes (0xFF, the NaN, gives a NaN scale when used)."""
    c = np.asarray(codes)
    if c.dtype != np.uint8:
        raise LowbitError(f"E8M0 scales must be uint8 codes, got {c.dtype}")
    return c.astype(np.int32) - 127


def scale_values(scale_exp: np.ndarray, int_shift: int = 0) -> np.ndarray:
    """The float32 scale ``2**(scale_exp - int_shift)`` (2**-133 is a float32 subnormal)."""
    return np.ldexp(np.float32(1.0), np.asarray(scale_exp, dtype=np.int32) - int_shift).astype(
        np.float32
    )
