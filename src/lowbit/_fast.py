"""Optional compiled kernels (numba). ``encode_float`` returns False when none applies."""

from __future__ import annotations

from typing import Any

import numpy as np


def encode_float(
    fmt: Any, x: np.ndarray, mode: int, saturate: bool, rbits: np.ndarray | None, out: np.ndarray
) -> bool:
    """Fill ``out`` with the codes of ``x`` if a compiled kernel applies; else return False."""
    return False
