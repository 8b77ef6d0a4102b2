"""Exceptions lowbit raises for bad input. Every one names the bad value and what is allowed."""

from __future__ import annotations


class LowbitError(ValueError):
    """Base class: bad input to lowbit (the CLI prints its message on one line, exit status 2)."""


class UnknownFormatError(LowbitError, KeyError):
    """A format name that is not in the catalog."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class NaNPolicyError(LowbitError):
    """A NaN met a format (or quantizer) with no NaN code and no policy for it."""


class CodeRangeError(LowbitError):
    """A code (bit pattern) that does not fit the format."""


class UnderflowError(LowbitError):
    """A tensor with nonzero values quantized to all zeros, under ``underflow="raise"``."""


class UnderflowWarning(UserWarning):
    """A tensor with nonzero values quantized to all zeros: its scales underflowed.

    ``lowbit.quantize(..., underflow="raise")`` makes it an :class:`UnderflowError`,
    ``underflow="ignore"`` silences it; ``warnings.filterwarnings`` works as usual.
    """
