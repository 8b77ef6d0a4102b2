"""Every metadata value lowbit packs into a GGUF, checked against its GGUF type first.

The ``gguf`` package packs with ``struct``: a config's 2**40 as UINT32 was a
``struct.error``, 1e39 as FLOAT32 an ``OverflowError``, and a NaN was written as it came
(issue 41). :func:`check_value` refuses, in one ``LowbitError`` line naming the key, an integer
outside its type's range (or not an integer), a float that is not finite or past float32, and
array elements of either kind. Values copied byte for byte from a source GGUF were checked by
the reader and are not passed here.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lowbit._json import short_repr
from lowbit.errors import LowbitError

__all__ = ["check_value"]

_INT_RANGES = {
    "UINT8": (0, 2**8 - 1), "INT8": (-(2**7), 2**7 - 1),
    "UINT16": (0, 2**16 - 1), "INT16": (-(2**15), 2**15 - 1),
    "UINT32": (0, 2**32 - 1), "INT32": (-(2**31), 2**31 - 1),
    "UINT64": (0, 2**64 - 1), "INT64": (-(2**63), 2**63 - 1),
}  # fmt: skip
_FLOAT_MAX = {
    "FLOAT32": float(np.finfo(np.float32).max),
    "FLOAT64": float(np.finfo(np.float64).max),
}


def _scalar(key: str, value: Any, kind: str) -> None:
    if kind in _INT_RANGES:
        lo, hi = _INT_RANGES[kind]
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise LowbitError(
                f"GGUF metadata {key!r}: {short_repr(value)} is not an integer ({kind})"
            )
        if not lo <= int(value) <= hi:
            raise LowbitError(
                f"GGUF metadata {key!r}: {short_repr(value)} does not fit {kind} ({lo}..{hi})"
            )
    elif kind in _FLOAT_MAX:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
            raise LowbitError(
                f"GGUF metadata {key!r}: {short_repr(value)} is not a number ({kind})"
            )
        v = float(value)
        if not math.isfinite(v) or abs(v) > _FLOAT_MAX[kind]:
            raise LowbitError(
                f"GGUF metadata {key!r}: {short_repr(value)} is not a finite {kind} value"
            )


def check_value(key: str, value: Any, vtype: Any, sub: Any) -> None:
    """Refuse a metadata value its GGUF type cannot hold (see the module docstring).

    Raises:
        LowbitError: naming the key, the value and the type.
    """
    kind = getattr(vtype, "name", str(vtype))
    if kind != "ARRAY":
        _scalar(key, value, kind)
        return
    sub_kind = getattr(sub, "name", str(sub))
    if sub_kind not in _INT_RANGES and sub_kind not in _FLOAT_MAX:
        return
    if isinstance(value, (bytes, bytearray, memoryview)):
        return  # packed already (lowbit packs long arrays in one pass)
    items = list(value)
    if not items:
        return
    arr = np.asarray(items, dtype=object)
    numeric = all(
        isinstance(v, (int, float, np.number)) and not isinstance(v, (bool, np.bool_)) for v in arr
    )
    if not numeric:
        bad = next(
            v
            for v in arr
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.number))
        )
        raise LowbitError(
            f"GGUF metadata {key!r}: element {short_repr(bad)} is not a number ({sub_kind})"
        )
    _scalar(key, min(items), sub_kind)
    _scalar(key, max(items), sub_kind)
    if sub_kind in _FLOAT_MAX and not all(math.isfinite(float(v)) for v in items):
        raise LowbitError(f"GGUF metadata {key!r}: an element is not a finite {sub_kind} value")
    if sub_kind in _INT_RANGES and not all(isinstance(v, (int, np.integer)) for v in items):
        raise LowbitError(f"GGUF metadata {key!r}: an element is not an integer ({sub_kind})")
