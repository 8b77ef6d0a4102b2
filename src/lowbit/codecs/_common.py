"""What both codec paths (numpy and numba) share: the errors they raise and the value tables.

A table is every code's value of a float format of at most 16 bits, computed once per format
and dtype from the format's own float64 table (``FloatFormat._table64``).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from lowbit.enums import Inf, NaN
from lowbit.errors import LowbitError, NaNPolicyError

__all__ = ["FloatFields", "nan_error", "negative_error", "value_table"]


class FloatFields(Protocol):
    """What the float codecs read of a format: its bit fields and derived facts.

    ``lowbit.formats.floats.FloatFormat`` is one; the codecs sit below the formats (a format's
    ``encode``/``decode`` call them), so they name this protocol instead of the class.
    """

    @property
    def name(self) -> str: ...
    @property
    def bits(self) -> int: ...
    @property
    def ebits(self) -> int: ...
    @property
    def mbits(self) -> int: ...
    @property
    def bias(self) -> int: ...
    @property
    def signed(self) -> bool: ...
    @property
    def subnormals(self) -> bool: ...
    @property
    def inf(self) -> Inf: ...
    @property
    def nan(self) -> NaN: ...
    @property
    def emin(self) -> int: ...
    @property
    def magnitude_bits(self) -> int: ...
    @property
    def code_dtype(self) -> np.dtype: ...
    @property
    def has_inf(self) -> bool: ...
    @property
    def has_nan(self) -> bool: ...
    @property
    def has_zero(self) -> bool: ...
    @property
    def has_negative_zero(self) -> bool: ...
    @property
    def inf_code(self) -> int | None: ...
    @property
    def nan_code(self) -> int | None: ...
    @property
    def max_code_magnitude(self) -> int: ...
    @property
    def max(self) -> float: ...
    @property
    def min(self) -> float: ...
    @property
    def smallest_positive(self) -> float: ...
    @property
    def _table64(self) -> np.ndarray: ...


def nan_error(fmt: FloatFields) -> NaNPolicyError:
    """The error for NaN input to a format without NaN under ``nan="raise"``."""
    return NaNPolicyError(
        f"input contains NaN and {fmt.name} has no NaN code; pass nan='zero' to write "
        "+0 instead, or remove the NaNs"
    )


def negative_error(fmt: FloatFields) -> LowbitError:
    """The error for negative input to an unsigned format without NaN (not saturating)."""
    return LowbitError(
        f"negative input for the unsigned format {fmt.name}, which has no NaN; "
        "pass saturate=True to clamp to its smallest value"
    )


_TABLES: dict[tuple[FloatFields, np.dtype], np.ndarray] = {}


def value_table(fmt: FloatFields, dtype: np.dtype) -> np.ndarray:
    """Value of every code of a format of at most 16 bits, in ``dtype`` (cached)."""
    key = (fmt, dtype)  # not dtype.str: ml_dtypes' float8 types all read "<V1"
    table = _TABLES.get(key)
    if table is None:
        table = fmt._table64.astype(dtype)
        table.setflags(write=False)
        _TABLES[key] = table
    return table
