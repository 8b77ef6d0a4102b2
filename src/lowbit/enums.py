"""String-valued enums shared by every layer: rounding modes and where a float format keeps its
infinities and NaNs. They sit at the bottom with ``lowbit.errors``, so the codecs (below the
formats) and the formats use the same ones.
"""

from __future__ import annotations

from enum import Enum

from lowbit.errors import LowbitError

__all__ = ["Inf", "NaN", "Rounding", "as_rounding"]


class Rounding(str, Enum):
    """How a value between two representable neighbours is rounded.

    ``nearest_even`` is IEEE 754's default (ties to the even code); ``nearest_away`` breaks
    ties away from zero; the three directed modes are IEEE 754 §4.3.2; ``stochastic`` rounds
    up with probability equal to the distance from the lower neighbour, in units of the gap
    (exactly, from 64 random bits per element: see ``FloatFormat.encode``).
    """

    NEAREST_EVEN = "nearest_even"
    NEAREST_AWAY = "nearest_away"
    TOWARD_ZERO = "toward_zero"
    TOWARD_POSITIVE = "toward_positive"
    TOWARD_NEGATIVE = "toward_negative"
    STOCHASTIC = "stochastic"


_ROUNDING_ALIASES = {
    "rne": Rounding.NEAREST_EVEN,
    "nearest": Rounding.NEAREST_EVEN,
    "even": Rounding.NEAREST_EVEN,
    "rna": Rounding.NEAREST_AWAY,
    "away": Rounding.NEAREST_AWAY,
    "rtz": Rounding.TOWARD_ZERO,
    "truncate": Rounding.TOWARD_ZERO,
    "zero": Rounding.TOWARD_ZERO,
    "up": Rounding.TOWARD_POSITIVE,
    "ceil": Rounding.TOWARD_POSITIVE,
    "down": Rounding.TOWARD_NEGATIVE,
    "floor": Rounding.TOWARD_NEGATIVE,
    "sr": Rounding.STOCHASTIC,
}


def as_rounding(value: str | Rounding) -> Rounding:
    """Parse a rounding mode (its name or a common alias such as ``rne``, ``rtz``, ``sr``)."""
    if isinstance(value, Rounding):
        return value
    key = str(value).strip().lower().replace("-", "_")
    try:
        return Rounding(key)
    except ValueError:
        pass
    if key in _ROUNDING_ALIASES:
        return _ROUNDING_ALIASES[key]
    allowed = ", ".join(r.value for r in Rounding)
    raise LowbitError(f"unknown rounding mode {value!r}; allowed: {allowed}")


class Inf(str, Enum):
    """Where a float format keeps its infinities.

    ``none``: no infinities. ``ieee``: exponent field all ones, mantissa zero.
    ``high``: the largest magnitude code that is not a NaN (IEEE P3109 "extended" formats).
    """

    NONE = "none"
    IEEE = "ieee"
    HIGH = "high"


class NaN(str, Enum):
    """Where a float format keeps its NaNs.

    ``none``: no NaN. ``ieee``: exponent field all ones, mantissa non-zero.
    ``high``: only the all-ones magnitude code, for each sign (OCP E4M3 "fn"; unsigned P3109).
    ``neg_zero``: the single code that would be negative zero (the "fnuz" formats, signed P3109).
    """

    NONE = "none"
    IEEE = "ieee"
    HIGH = "high"
    NEG_ZERO = "neg_zero"
