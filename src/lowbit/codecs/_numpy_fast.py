"""The numpy path's fast encoders and decoders: code tables, and exact delegation.

Without numba, ``vectorised.encode_float`` tries these before its general chunk loop
(``_general.encode_general``: single rounding on float64 bit fields, every mode). Each
gives exactly that loop's codes, for deterministic rounding modes. A table is built once
as many values have been encoded alike as it has entries (building it costs about as
much as encoding those in the general loop) and kept per format, mode, saturation and
input dtype (64 MB in all at most):

- **float16 or bfloat16 input** (65,536 possible values): the code of every input bit
  pattern, one table per format, mode, saturation and input dtype; encoding is a lookup.
- **float32 or float64 input, keyed table.** The code of an input ``x`` can only change
  at the format's values, the midpoints between neighbouring values and the overflow
  threshold (max plus half the spacing at max). Take the fewest top bits of the input,
  ``prefix`` (16 to 20), below which all of those points have only zero bits: then ``x``
  rounds as any other input with the same top ``prefix`` bits and the same "lower bits
  zero or not" does. The key is the input's top ``prefix + 1`` bits rounded to odd,
  ``(bits >> s) | (the s bits below != 0)``: the top ``prefix`` bits and whether any
  lower bit is set. It indexes a table of ``2**(prefix + 1)`` codes, each made by the
  general loop from one representative input. For float32 input, formats with at most 6
  mantissa bits (FP8/FP6/FP4, E8M0, the 8-bit P3109 formats) need 16 bits (the bfloat16
  grid: 131,072 codes), float16 20 (2M codes, 4 MB); for float64 input, at most 7
  mantissa bits.
- **float32 input, bfloat16 or float16 layout, nearest-even:** ml_dtypes' and numpy's
  casts round the same way (IEEE 754 nearest-even with overflow to ±inf); saturation
  clamps to ±max first. numpy keeps NaN payloads in float16, so NaNs are rewritten to
  the quiet NaN with the input's sign, as lowbit writes them; ml_dtypes' bfloat16 cast
  already does. bfloat16 always takes the cast (it runs at memory speed), float16 until
  its table is worth building. ``tests/codecs/test_codec_numpy_path.py`` checks every
  path against the general loop on every class of input it distinguishes.

Decoding of formats of at most 16 bits is a lookup in the value table (per chunk, so the
lookup's index conversion stays in cache); bfloat16 to float32 is ml_dtypes' cast with
NaNs made the table's quiet NaN. Large arrays go to ``lowbit._parallel``'s threads in
pieces of whole chunks (threads never change a result).
"""

from __future__ import annotations

import sys
import threading
from functools import lru_cache
from typing import Any

import numpy as np

from lowbit._arrays import bfloat16, is_bfloat16
from lowbit._parallel import map_chunks, threads
from lowbit.codecs import _general
from lowbit.codecs._common import FloatFields, nan_error, negative_error
from lowbit.enums import Inf, NaN, Rounding

_CHUNK = 1 << 15  # elements per step of the keyed encoder: input, keys, codes stay in L2
_STEP = 1 << 16  # elements per step of lookups and casts (one pass each: larger steps)
_PIECE = 1 << 18  # elements per thread's piece (smaller arrays: one thread)
_TABLE_BYTES = 64 << 20  # all tables together, the oldest dropped first
_MAX_PREFIX = 20  # keys of at most 21 bits: tables of at most 2M codes (4 MB)

_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_KEYED = {_F32: np.dtype(np.uint32), _F64: np.dtype(np.uint64)}  # and their bit views
_CAST_LAYOUTS = {
    (8, 7, 127): "bfloat16",  # ml_dtypes' bfloat16 cast (ml_dtypes imported when first used)
    (5, 10, 15): "float16",  # numpy's float16 cast
}

_tables: dict[tuple[Any, ...], np.ndarray] = {}
_lock = threading.Lock()
_counts: dict[tuple[Any, ...], int] = {}


def _cached(key: tuple[Any, ...], build: Any) -> np.ndarray:
    """The table for ``key``, built on first use (callers may be on several threads)."""
    table = _tables.get(key)
    if table is None:
        with _lock:
            table = _tables.get(key)
            if table is None:
                table = build()
                table.setflags(write=False)
                used = sum(t.nbytes for t in _tables.values())
                while _tables and used + table.nbytes > _TABLE_BYTES:
                    used -= _tables.pop(next(iter(_tables))).nbytes  # the oldest first
                _tables[key] = table
    return table


def _worth_a_table(key: tuple[Any, ...], n: int, entries: int) -> bool:
    """Whether the table for ``key`` is built or, counting these ``n`` values, as many
    values have been encoded alike as it has entries (building it costs about as much
    as encoding that many values in the general loop)."""
    if key in _tables:
        return True
    if len(_counts) > 4096:
        _counts.clear()
    _counts[key] = seen = _counts.get(key, 0) + n
    return seen >= entries


@lru_cache(maxsize=512)
def key_prefix(fmt: FloatFields, dtype: np.dtype) -> int | None:
    """The fewest top bits (16 to 20) of a ``dtype`` input (float32 or float64) that hold
    every point at which ``fmt``'s codes can change, the bits below them zero; None if
    more are needed.

    Those points are the magnitudes of the format's values, the midpoints between
    neighbouring magnitudes (with 0 where the format has it: the edge of the rounding
    zone of formats without subnormals) and the overflow threshold ``max + ulp(max)/2``;
    directed modes only use the values. Points beyond the input's range never separate
    two inputs. For float32 input: 16 bits (bfloat16 values) for at most 6 mantissa
    bits whose range bfloat16 covers (FP8/FP6/FP4), 20 for float16.
    """
    if fmt.bits > 16 or np.dtype(fmt.code_dtype) not in (np.uint8, np.uint16):
        return None
    uint = _KEYED[dtype]
    width = 8 * uint.itemsize
    mags = np.unique(np.abs(fmt.values()))
    top = float(np.floor(np.log2(fmt.max)))
    over = fmt.max + 2.0 ** (top - fmt.mbits) / 2
    points = np.concatenate([mags, (mags[:-1] + mags[1:]) / 2, [over]])
    points = points[points <= float(np.finfo(dtype).max)]
    exact = points.astype(dtype)
    if not np.array_equal(exact.astype(np.float64), points):
        return None
    bits = exact.view(uint)
    for prefix in range(16, _MAX_PREFIX + 1):
        if not (bits & uint.type((1 << (width - prefix)) - 1)).any():
            return prefix
    return None


def _general_codes(fmt: FloatFields, x: np.ndarray, mode: Rounding, saturate: bool) -> np.ndarray:
    """The general chunk loop's codes of ``x`` (no NaN or sign checks)."""
    return _general.encode_general(fmt, x, mode, saturate, None, False, False)


def _representatives(dtype: np.dtype, prefix: int, unsigned_only: bool) -> np.ndarray:
    """One input of ``dtype`` per table entry: every bit pattern of a 16-bit input; for
    float32/float64, key ``k`` stands for the inputs whose top ``prefix`` bits are
    ``k >> 1`` and whose lower bits are zero (``k`` even) or not (odd). ``unsigned_only``
    clears the sign bit, for formats that refuse negative input before any lookup."""
    if dtype in _KEYED:
        uint = _KEYED[dtype]
        low = uint.type(8 * uint.itemsize - prefix)
        keys = np.arange(1 << (prefix + 1), dtype=uint)
        pattern = ((keys >> uint.type(1)) << low) | (keys & uint.type(1))
        sign = uint.type(1 << (8 * uint.itemsize - 1))
    else:
        uint = np.dtype(np.uint16)
        pattern = np.arange(1 << 16, dtype=np.uint32).astype(uint)
        sign = uint.type(0x8000)
    if unsigned_only:
        pattern &= ~sign
    return pattern.view(dtype)


def _table(
    fmt: FloatFields, mode: Rounding, saturate: bool, dtype: np.dtype, prefix: int
) -> np.ndarray:
    """Codes of every table entry for inputs of ``dtype``."""
    unsigned_only = not fmt.signed and not fmt.has_nan and not saturate
    return _general_codes(fmt, _representatives(dtype, prefix, unsigned_only), mode, saturate)


def _pieces(n: int) -> list[tuple[int, int]]:
    if n == 0:
        return [(0, 0)]
    parts = max(1, min(threads(), n // _PIECE))
    step = -(-n // parts)
    step = -(-step // _STEP) * _STEP  # whole steps per piece
    return [(a, min(a + step, n)) for a in range(0, n, step)]


def _run(work: Any, n: int) -> list[Any]:
    """``work(a, b)`` over pieces of ``range(n)``, on threads when there are several."""
    pieces = _pieces(n)
    if len(pieces) == 1:
        return [work(*pieces[0])]
    return map_chunks(lambda p: work(*p), pieces)


def _flags(x: np.ndarray, nan_check: bool, neg_check: bool) -> tuple[bool, bool]:
    """(holds a NaN, holds a value below zero), each only where asked."""
    if not nan_check and not neg_check:
        return False, False
    with np.errstate(invalid="ignore"):
        if x.dtype in _KEYED:
            low = x.min()  # one read, no temporary; NaN propagates
            has_nan = bool(np.isnan(low))
            if not has_nan:
                return False, bool(low < 0)
            return True, bool(neg_check and (x < 0).any())
        return bool(nan_check and np.isnan(x).any()), bool(neg_check and (x < 0).any())


def _keyed_encode(
    table: np.ndarray,
    prefix: int,
    x: np.ndarray,
    out: np.ndarray,
    nan_check: bool,
    neg_check: bool,
) -> tuple[bool, bool]:
    """Codes of float32/float64 ``x`` into ``out``: the table entry of each input's key,
    its top ``prefix + 1`` bits rounded to odd (``(bits >> s) | (bits below s != 0)``).

    The key takes four in-place passes over one buffer: ``(bits & mask) + mask`` carries
    into bit ``s`` exactly when a bit below ``s`` is set, and stays below ``2**(s + 1)``,
    so OR-ing it into the bits and shifting leaves that "sticky" bit in the key's lowest
    place. One buffer and no ``minimum`` pass take about a fifth less time than shift,
    and, minimum and or on two buffers did.
    """
    uint = _KEYED[x.dtype]
    s = 8 * uint.itemsize - prefix - 1
    u = x.view(uint)
    shift, mask = uint.type(s), uint.type((1 << s) - 1)
    key = np.empty(min(_CHUNK, u.size), dtype=uint)
    # The checks take each chunk's minimum while it is in cache and judge them all at
    # the end (judging per chunk cost more than the minimum). NaN propagates through
    # ``minimum``, so a chunk whose minimum is not NaN holds none; without the NaN check,
    # ``fmin`` skips NaNs and finds the negatives.
    low = np.minimum.reduce if nan_check else np.fmin.reduce if neg_check else None
    lows = np.empty(-(-u.size // _CHUNK), dtype=x.dtype)
    for i, a in enumerate(range(0, u.size, _CHUNK)):
        uc = u[a : a + _CHUNK]
        k = key[: uc.size]
        np.bitwise_and(uc, mask, out=k)
        np.add(k, mask, out=k)
        np.bitwise_or(k, uc, out=k)
        np.right_shift(k, shift, out=k)
        np.take(table, k, out=out[a : a + uc.size], mode="clip")  # keys are < table.size
        if low is not None:
            lows[i] = low(x[a : a + _CHUNK])
    if low is None:
        return False, False
    with np.errstate(invalid="ignore"):
        return nan_check and bool(np.isnan(lows).any()), bool((lows < 0).any())


def _lookup_encode(
    table: np.ndarray, x: np.ndarray, out: np.ndarray, nan_check: bool, neg_check: bool
) -> tuple[bool, bool]:
    """Codes of float16/bfloat16 ``x`` into ``out``: one lookup per input bit pattern."""
    u = x.view(np.uint16)
    seen_nan = seen_neg = False
    for a in range(0, u.size, _STEP):
        np.take(table, u[a : a + _STEP], out=out[a : a + _STEP], mode="clip")
        has_nan, has_neg = _flags(x[a : a + _STEP], nan_check, neg_check)
        seen_nan |= has_nan
        seen_neg |= has_neg
    return seen_nan, seen_neg


def _cast_encode(
    fmt: FloatFields, peer: np.dtype, saturate: bool, x: np.ndarray, out: np.ndarray
) -> tuple[bool, bool]:
    """Codes of float32 ``x`` by the peer's nearest-even cast (see the module docstring)."""
    view = out.view(peer)
    limit = np.float32(fmt.max)
    clipped = np.empty(min(_STEP, x.size), dtype=np.float32) if saturate else None
    for a in range(0, x.size, _STEP):
        xc = x[a : a + _STEP]
        if clipped is not None:
            xc = np.clip(xc, -limit, limit, out=clipped[: xc.size])
        with np.errstate(over="ignore", invalid="ignore"):
            np.copyto(view[a : a + xc.size], xc, casting="unsafe")
        if peer == _F16 and np.isnan(xc.min()):  # numpy keeps NaN payloads: drop them
            nan = np.flatnonzero(np.isnan(xc))
            signs = np.signbit(xc[nan]).astype(np.uint16) << 15
            out[a + nan] = signs | np.uint16(fmt.nan_code)
    return False, False


def _cast_peer(fmt: FloatFields, mode: Rounding) -> str | None:
    """The name of the dtype (``bfloat16``, ``float16``) whose float32 cast is lowbit's
    encode of ``fmt``, or None."""
    ieee = fmt.signed and fmt.subnormals and fmt.inf is Inf.IEEE and fmt.nan is NaN.IEEE
    if mode is not Rounding.NEAREST_EVEN or not ieee:
        return None
    return _CAST_LAYOUTS.get((fmt.ebits, fmt.mbits, fmt.bias))


def applies(fmt: FloatFields, dtype: np.dtype, mode: Rounding) -> bool:
    """Whether :func:`encode` has a route (a keyed table or an exact cast) for ``dtype``
    input in ``fmt`` and ``mode`` once it has seen enough values: the choice between it
    and the compiled kernels (``lowbit.codecs._numba``) is then measured."""
    if mode is Rounding.STOCHASTIC or np.dtype(fmt.code_dtype) not in (np.uint8, np.uint16):
        return False
    if fmt.bits > 16 or dtype not in (_F64, _F32):
        return False
    return key_prefix(fmt, dtype) is not None or (
        dtype == _F32 and _cast_peer(fmt, mode) is not None
    )


def encode(
    fmt: FloatFields,
    x: np.ndarray,
    mode: Rounding,
    saturate: bool,
    *,
    nan_check: bool,
    neg_check: bool,
) -> np.ndarray | None:
    """Codes of flat float16/bfloat16/float32 ``x``, or None where no fast path applies.

    Args:
        fmt: the FloatFormat.
        x: flat contiguous input.
        mode: a deterministic rounding mode (stochastic: None).
        saturate: clamp overflow and infinities to ±max.
        nan_check: raise NaNPolicyError if ``x`` holds a NaN.
        neg_check: raise LowbitError if ``x`` holds a negative value.

    Returns:
        Codes of ``fmt.code_dtype``, or None.

    Raises:
        NaNPolicyError, LowbitError: as ``vectorised.encode_float`` does.
    """
    if mode is Rounding.STOCHASTIC or (
        x.dtype not in (_F64, _F32, _F16) and not is_bfloat16(x.dtype)
    ):
        return None
    if np.dtype(fmt.code_dtype) not in (np.uint8, np.uint16) or fmt.bits > 16:
        return None
    out = np.empty(x.size, dtype=fmt.code_dtype)
    key = (fmt, mode, bool(saturate), x.dtype)
    peer = _cast_peer(fmt, mode) if x.dtype == _F32 and not neg_check else None
    if peer == "bfloat16" and x.size < _CHUNK and "ml_dtypes" not in sys.modules:
        peer = None  # a small array does not import ml_dtypes (most of a cold start)
    prefix = key_prefix(fmt, x.dtype) if x.dtype in _KEYED else 15  # 16-bit input: 65,536
    if peer == "bfloat16" and not saturate:  # ml_dtypes' cast runs at memory speed: one call
        with np.errstate(over="ignore", invalid="ignore"):
            return x.astype(bfloat16()).view(fmt.code_dtype)
    if peer == "bfloat16":
        table = None
    elif prefix is not None and _worth_a_table(key, x.size, 2 << prefix):
        table = _cached(key, lambda: _table(fmt, mode, saturate, x.dtype, prefix))
    elif peer is None:
        return None  # the general loop (until enough values have been encoded alike)
    else:
        table = None
    if table is None:
        cast = bfloat16() if peer == "bfloat16" else _F16
        flags = _run(lambda a, b: _cast_encode(fmt, cast, saturate, x[a:b], out[a:b]), x.size)
    elif x.dtype in _KEYED:
        flags = _run(
            lambda a, b: _keyed_encode(table, prefix, x[a:b], out[a:b], nan_check, neg_check),
            x.size,
        )
    else:
        flags = _run(
            lambda a, b: _lookup_encode(table, x[a:b], out[a:b], nan_check, neg_check), x.size
        )
    if nan_check and any(f[0] for f in flags):
        raise nan_error(fmt)
    if neg_check and any(f[1] for f in flags):
        raise negative_error(fmt)
    return out


def decode(fmt: FloatFields, codes: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Values of validated codes (uint8/uint16/intp) of a format of at most 16 bits,
    looked up in ``table`` (``_common.value_table``), in chunks."""
    if codes.ndim == 0 or codes.size < _CHUNK:
        return np.take(table, codes)
    flat = np.ascontiguousarray(codes).reshape(-1)
    out = np.empty(flat.size, dtype=table.dtype)
    bf16 = flat.dtype == np.uint16 and _cast_peer(fmt, Rounding.NEAREST_EVEN) == "bfloat16"
    if table.dtype == _F32 and bf16:
        bf16_dtype = bfloat16()
        nan_bits = table.view(np.uint32)[fmt.nan_code]  # the table's quiet NaN

        def cast(a: int, b: int) -> None:
            for c in range(a, b, _STEP):
                part = out[c : min(c + _STEP, b)]
                np.copyto(part, flat[c : c + part.size].view(bf16_dtype), casting="unsafe")
                if np.isnan(part.min()):  # ml_dtypes keeps NaN payloads: drop them
                    bits = part.view(np.uint32)
                    nan = np.isnan(part)
                    bits[nan] = (bits[nan] & np.uint32(0x80000000)) | nan_bits

        _run(cast, flat.size)
        return out.reshape(codes.shape)

    def take(a: int, b: int) -> None:
        for c in range(a, b, _STEP):
            e = min(c + _STEP, b)
            np.take(table, flat[c:e], out=out[c:e], mode="clip")

    _run(take, flat.size)
    return out.reshape(codes.shape)
