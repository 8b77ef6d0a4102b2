"""The per-tensor steps every format's writer shares (``lowbit.checkpoints.streaming``):
reading one tensor, quantizing it, its raw bytes, a kept tensor's dtype, and the clock of
the work; each format's own step is its package's ``pipeline.py``.

Every function here touches one tensor at a time and drops its memory map before reading the
next (``Checkpoint.close()``; mapped pages that were read count as resident memory).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from lowbit._arrays import bfloat16
from lowbit.codecs.packing import _pack_unchecked, unpack
from lowbit.errors import LowbitError
from lowbit.plans.plan import TensorPlan
from lowbit.quant.quantized_tensor import QuantizedTensor
from lowbit.quant.tensor import quantize


def kept_dense(arr: Any) -> np.ndarray:
    """A kept tensor the source stores in a GGUF block type (Q8_0, Q4_K ...), for a format that
    holds only plain dtypes (compressed-tensors): float16 when every value is within float16's
    range, else bfloat16; never float32, which would double or quadruple the source's size.

    float16 rounds each value to 11 significant bits (relative error at most 2**-11), far
    below the block type's own step (Q8_0: 1/127 of the block's largest value); a block
    type's scales are float16, so its values exceed float16's range only in blocks whose
    largest value is above 65504.
    """
    a = np.asarray(arr, dtype=np.float32)
    return a.astype(dense_dtype(a))


def dense_dtype(a: np.ndarray) -> np.dtype:
    """kept_dense's choice for float32 ``a``: float16 when every value is within its range
    (a NaN is not), else bfloat16. Two reductions, no temporary of ``a``'s size."""
    top = np.float32(np.finfo(np.float16).max)
    if a.size == 0 or (a.max() <= top and a.min() >= -top):
        return np.dtype(np.float16)
    return bfloat16()


# ---------------------------------------------------------------------------------------
# Streaming
# ---------------------------------------------------------------------------------------


def read_quantized(checkpoint: Any, t: TensorPlan, done: Mapping[str, Any] | None = None) -> Any:
    """Read one tensor and quantize it; its memory map is dropped before the next read.
    A tensor in ``done`` (name -> QuantizedTensor, e.g. from GPTQ) is taken from there."""
    if done is not None and t.name in done:
        qt = done[t.name]
        if qt.shape != tuple(t.shape) or qt.scheme != t.scheme:
            raise LowbitError(f"tensor {t.name!r}: the given quantized tensor is not as planned")
        return qt
    checkpoint.close()  # unmap the previous tensor's pages (they count as resident memory)
    arr = checkpoint.get(t.name)
    try:
        return quantize(arr, t.scheme)
    except LowbitError as exc:
        raise LowbitError(f"tensor {t.name!r}: {exc}") from None
    finally:
        del arr


def read_cast(checkpoint: Any, t: TensorPlan) -> np.ndarray:
    checkpoint.close()
    arr = checkpoint.get(t.name)
    if t.cast == "bfloat16":
        return np.asarray(arr, dtype=np.float32).astype(bfloat16())
    with np.errstate(over="ignore"):
        out = np.asarray(arr).astype(t.cast)
    if not np.isfinite(out).all() and np.isfinite(np.asarray(arr, dtype=np.float32)).all():
        raise LowbitError(f"tensor {t.name!r}: values overflow {t.cast} when cast")
    return out


def raw_bytes(checkpoint: Any, name: str) -> np.ndarray:
    """The stored bytes of one tensor, uint8 ``[rows, bytes per row]`` (memory-mapped)."""
    info = checkpoint.info(name)
    shape = raw_shape(info.shape, info.nbytes)
    if info.nbytes == 0:
        return np.zeros(shape, dtype=np.uint8)
    if info.offset < 0:  # no span of its own on disk (an expert of a fused tensor): its values
        arr = np.ascontiguousarray(checkpoint.get(name))
        return arr.view(np.uint8).reshape(raw_shape(arr.shape, arr.nbytes))
    raw = np.memmap(info.file, dtype=np.uint8, mode="r", offset=info.offset, shape=(info.nbytes,))
    return np.asarray(raw).reshape(shape)


def raw_shape(shape: tuple[int, ...], nbytes: int) -> tuple[int, ...]:
    """``[rows, bytes per row]`` for 2-D+ tensors, ``[bytes]`` for 1-D ones."""
    if len(shape) <= 1:
        return (nbytes,)
    rows = math.prod(shape[:-1])
    return (rows, nbytes // rows) if rows else (0, 0)


class Clock:
    """Seconds spent making the tensors a writer writes (reading the source, rounding it,
    casting), summed over every call of the functions :meth:`timed` wraps; the rest of a
    write is packing, hashing and writing files."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def timed(self, fn: Any) -> Any:
        def run(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.seconds += time.perf_counter() - start

        return run


class LazyMapping(Mapping):
    """A Mapping whose values are made when looked up (the exporters look each one up twice,
    planning and writing, and keep none in between)."""

    def __init__(self, keys: list[str], make: Any) -> None:
        self._keys = keys
        self._index = set(keys)
        self._make = make

    def __getitem__(self, key: str) -> Any:
        if key not in self._index:
            raise KeyError(key)
        return self._make(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def rows_permuted(qt: Any, permute: Any) -> Any:
    """A 2-D QuantizedTensor with its rows reordered by ``permute`` (a function on arrays
    with rows first): codes, scales and zero points; a per-tensor scale stays."""
    rows, cols = qt.shape
    raw = unpack(qt.codes, qt.format.bits, qt.numel).reshape(rows, cols)
    order = np.asarray(permute(np.arange(rows)))

    def move(a: Any) -> Any:
        return a if a is None or a.shape[0] != rows else np.ascontiguousarray(a[order])

    if qt._dq is not None:
        raise LowbitError("double-quantized scales cannot be reordered; write a lowbit checkpoint")
    ts = None if qt.tensor_scale is None else (move(qt.group_scale), qt.tensor_scale)
    return QuantizedTensor(
        codes=_pack_unchecked(np.ascontiguousarray(raw[order]).reshape(-1), qt.format.bits),
        scale=move(qt.scale),
        zero_point=move(qt.zero_point),
        shape=qt.shape,
        scheme=qt.scheme,
        ts=ts,  # NVFP4: the group scales move with their rows, the tensor scale stays
    )
