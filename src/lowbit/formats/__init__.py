"""What a number is: the format descriptions, their catalog and the exact reference.

- :mod:`~lowbit.formats.base`: the :class:`Format` protocol every format follows.
- :mod:`~lowbit.formats.floats`, :mod:`~lowbit.formats.ints`, :mod:`~lowbit.formats.valueset`,
  :mod:`~lowbit.formats.mx`: the four kinds (IEEE-style floats, integers, value sets such as
  NF4, OCP MX blocks).
- :mod:`~lowbit.formats.catalog`: one declaration per named format, aliases in one dict.
- :mod:`~lowbit.formats.reference`: exact encode/decode in ``int``/``Fraction`` (slow, obviously
  right); every fast codec is tested against it.
- :mod:`~lowbit.formats.explain`: one value or code explained in every format (the CLI's
  ``show``/``decode``/``values``).
Rounding modes and special-value encodings are :mod:`lowbit.enums` (shared with the codecs).

A format's array methods (``encode``/``decode``) call down into the fast codecs
(:mod:`lowbit.codecs`), which read only a format's fields; nothing here imports a quantizer.
"""

from __future__ import annotations

from lowbit.enums import Inf, NaN, Rounding
from lowbit.formats.base import Format
from lowbit.formats.catalog import ALIASES, FORMATS, format, p3109
from lowbit.formats.floats import FloatFormat
from lowbit.formats.ints import IntFormat
from lowbit.formats.valueset import ValueSetFormat

__all__ = [
    "ALIASES",
    "FORMATS",
    "FloatFormat",
    "Format",
    "Inf",
    "IntFormat",
    "NaN",
    "Rounding",
    "ValueSetFormat",
    "format",
    "p3109",
]
