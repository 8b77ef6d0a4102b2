"""Turning user input into numpy arrays, and random bits for stochastic rounding."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from lowbit.errors import CodeRangeError, LowbitError

# Input dtypes whose values convert to float64 exactly.
_EXACT_FLOAT_KINDS = "f"


def as_float64(x: Any) -> np.ndarray:
    """Return ``x`` as a float64 array holding exactly the same values.

    Accepts Python scalars and (nested) lists, numpy arrays of any float dtype (float16,
    float32, float64, ml_dtypes' bfloat16/float8/...), integer and bool arrays (converted
    exactly when |x| < 2**53), and torch tensors (converted on the CPU).

    Raises:
        LowbitError: for non-numeric input (strings, objects, complex numbers).
    """
    x = _from_torch(x)
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError) as exc:  # ragged lists and the like
        raise LowbitError(f"cannot read input as a numeric array: {exc}") from None
    if arr.dtype == np.float64:
        return arr
    if arr.dtype.kind in "fiub" or _is_ml_float(arr.dtype):
        with np.errstate(invalid="ignore"):  # signalling NaNs widen quietly
            return arr.astype(np.float64)
    raise LowbitError(f"input must be numeric (float, int or bool), got dtype {arr.dtype}")


def ml_dtype(name: str) -> np.dtype:
    """ml_dtypes' dtype ``name`` (``bfloat16``, ``float8_e4m3fn`` ...), importing ml_dtypes on
    first use.

    ml_dtypes is imported only where it is needed (bfloat16 casts of large arrays, checkpoint
    readers and writers): its import is most of a cold start (0.1 s of CPU with 0.6, 0.7-0.8 s
    with 0.7), so ``lowbit show`` or a scalar's encode never pays it.
    """
    import ml_dtypes  # lazy: see the docstring

    return np.dtype(getattr(ml_dtypes, name))


def bfloat16() -> np.dtype:
    """ml_dtypes' bfloat16 dtype (:func:`ml_dtype`)."""
    return ml_dtype("bfloat16")


def is_bfloat16(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is ml_dtypes' bfloat16, without importing ml_dtypes (an array of
    that type can exist only once ml_dtypes is imported)."""
    ml = sys.modules.get("ml_dtypes")
    return ml is not None and dtype == ml.bfloat16


def _is_ml_float(dtype: np.dtype) -> bool:
    if dtype.kind == "c":  # ml_dtypes.finfo accepts complex types; lowbit does not
        return False
    ml_dtypes = sys.modules.get("ml_dtypes")
    if ml_dtypes is None:  # no ml_dtypes type exists before ml_dtypes is imported
        return False
    try:
        ml_dtypes.finfo(dtype)
    except (TypeError, ValueError):
        return False
    return True


def _from_torch(x: Any) -> Any:
    """Convert a torch tensor to numpy without importing torch ourselves."""
    if type(x).__module__.startswith("torch") and hasattr(x, "detach"):
        t = x.detach().cpu()
        name = str(t.dtype).removeprefix("torch.")
        if name in ("float64", "float32", "float16") or not t.is_floating_point():
            return t.numpy()
        # bfloat16 and float8 tensors have no numpy view: widen exactly to float32
        return t.float().numpy()
    return x


def random_bits(shape: tuple[int, ...], seed: Any) -> np.ndarray:
    """Uniform 64-bit random integers for stochastic rounding, from a seed or a Generator."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    return rng.integers(0, 2**64, size=shape, dtype=np.uint64, endpoint=False)


def check_random_bits(bits: Any, shape: tuple[int, ...]) -> np.ndarray:
    """Validate caller-supplied random bits: uint64, broadcastable to ``shape``."""
    arr = np.asarray(bits)
    if arr.dtype != np.uint64:
        raise LowbitError(f"random_bits must be uint64, got {arr.dtype}")
    try:
        return np.broadcast_to(arr, shape)
    except ValueError:
        raise LowbitError(
            f"random_bits of shape {arr.shape} do not broadcast to the input shape {shape}"
        ) from None


def code_dtype(bits: int) -> np.dtype:
    """The smallest unsigned integer dtype that holds a ``bits``-bit code."""
    for dt in (np.uint8, np.uint16, np.uint32, np.uint64):
        if bits <= np.dtype(dt).itemsize * 8:
            return np.dtype(dt)
    raise LowbitError(f"codes wider than 64 bits are not supported (got {bits})")


def check_codes(codes: Any, bits: int, name: str, *, widen: bool = True) -> np.ndarray:
    """Validate codes: an integer array whose values fit in ``bits`` bits.

    Returns them as uint64, or unchanged when ``widen`` is False. An unsigned dtype no
    wider than ``bits`` needs no scan; other unsigned dtypes only their maximum.
    """
    arr = np.asarray(codes)
    if arr.dtype.kind not in "iu":
        raise LowbitError(f"codes for {name} must be an integer array, got dtype {arr.dtype}")
    unsigned = arr.dtype.kind == "u"
    if arr.size and not (unsigned and arr.dtype.itemsize * 8 <= bits):
        hi = int(arr.max())
        lo = 0 if unsigned else int(arr.min())
        if lo < 0 or hi >= 1 << bits:
            bad = lo if lo < 0 else hi
            raise CodeRangeError(
                f"code {bad} is out of range for {name}: a {bits}-bit code is 0..{(1 << bits) - 1}"
            )
    return arr.astype(np.uint64, copy=False) if widen else arr
