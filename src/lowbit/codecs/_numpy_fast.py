"""The numpy path's fast encoders and decoders: code tables, and exact delegation.

Without numba, ``vectorised.encode_float`` tries these before its general chunk loop
(``vectorised._encode_general``: single rounding on float64 bit fields, every mode). Each
gives exactly that loop's codes, for deterministic rounding modes. A table is built (a
few ms) once enough values have been encoded alike to pay for it, and kept per format,
mode, saturation and input dtype:

- **float16 or bfloat16 input** (65,536 possible values): the code of every input bit
  pattern, one table per format, mode, saturation and input dtype; encoding is a lookup.
- **float32 or float64 input, keyed table.** The code of an input ``x`` can only change
  at the format's values, the midpoints between neighbouring values and the overflow
  threshold (max plus half the spacing at max). Where all of those have zero bits below
  the input's top 16 (for float32: are bfloat16 values, as in every format with at most 6
  mantissa bits whose range bfloat16 covers, FP8/FP6/FP4 among them; for float64: at
  most 3 mantissa bits), ``x`` rounds as any other input with the same top 16 bits and
  the same "lower bits zero or not" does. The key is the input's top 17 bits rounded to
  odd, ``(bits >> (low - 1)) | (the bits below those != 0)`` (``low`` = 16 for float32,
  48 for float64): the top 16 bits and whether any lower bit is set. It indexes a table
  of 131,072 codes, each made by the general loop from one representative input.
- **float32 input, bfloat16 or float16 layout, nearest-even:** ml_dtypes' and numpy's
  casts round the same way (IEEE 754 nearest-even with overflow to ±inf); saturation
  clamps to ±max first. numpy keeps NaN payloads in float16, so NaNs are rewritten to
  the quiet NaN with the input's sign, as lowbit writes them; ml_dtypes' bfloat16 cast
  already does. ``tests/codecs/test_codec_numpy_path.py`` checks each case against the
  general loop on every class of input.

Decoding of formats of at most 16 bits is a lookup in the value table (per chunk, so the
lookup's index conversion stays in cache); bfloat16 to float32 is ml_dtypes' cast with
NaNs made the table's quiet NaN. Large arrays go to ``lowbit._parallel``'s threads in
pieces of whole chunks (threads never change a result).
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

from lowbit.formats.enums import Inf, NaN, Rounding

if TYPE_CHECKING:
    from lowbit.formats.floats import FloatFormat

_CHUNK = 1 << 15  # elements per step of the keyed encoder: input, keys, codes stay in L2
_STEP = 1 << 16  # elements per step of lookups and casts (one pass each: larger steps)
_PIECE = 1 << 18  # elements per thread's piece (smaller arrays: one thread)
_TABLE_AFTER = 1 << 17  # values encoded alike before a table is built (building costs as much)
_MAX_TABLES = 64

_F16 = np.dtype(np.float16)
_BF16 = np.dtype(ml_dtypes.bfloat16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
# keyed inputs: their unsigned view and the bits below the 16-bit prefix of the key
_KEYED = {_F32: (np.dtype(np.uint32), 16), _F64: (np.dtype(np.uint64), 48)}
_CAST_LAYOUTS = {
    (8, 7, 127): _BF16,  # ml_dtypes' bfloat16 cast
    (5, 10, 15): _F16,  # numpy's float16 cast
}

_tables: dict[tuple[Any, ...], np.ndarray] = {}
_counts: dict[tuple[Any, ...], int] = {}


def _cached(key: tuple[Any, ...], build: Any) -> np.ndarray:
    table = _tables.get(key)
    if table is None:
        if len(_tables) >= _MAX_TABLES:
            _tables.pop(next(iter(_tables)))  # the oldest: a few MB at most in all
        table = build()
        table.setflags(write=False)
        _tables[key] = table
    return table


def _worth_a_table(key: tuple[Any, ...], n: int) -> bool:
    """Whether the table for ``key`` is built or, counting these ``n`` values, enough
    values have been encoded alike to pay for building it."""
    if key in _tables:
        return True
    if len(_counts) > 4096:
        _counts.clear()
    _counts[key] = seen = _counts.get(key, 0) + n
    return seen >= _TABLE_AFTER


@lru_cache(maxsize=512)
def on_key_grid(fmt: FloatFormat, dtype: np.dtype) -> bool:
    """Whether every input of ``dtype`` (float32 or float64) at which ``fmt``'s codes can
    change has zero bits below its top 16 (for float32: is a bfloat16 value).

    Those points are the magnitudes of the format's values, the midpoints between
    neighbouring magnitudes (with 0 where the format has it: the edge of the rounding
    zone of formats without subnormals) and the overflow threshold ``max + ulp(max)/2``;
    directed modes only use the values. Points beyond the input's range never separate
    two inputs.
    """
    if fmt.bits > 16 or np.dtype(fmt.code_dtype) not in (np.uint8, np.uint16):
        return False
    uint, low = _KEYED[dtype]
    mags = np.unique(np.abs(fmt.values()))
    top = float(np.floor(np.log2(fmt.max)))
    over = fmt.max + 2.0 ** (top - fmt.mbits) / 2
    points = np.concatenate([mags, (mags[:-1] + mags[1:]) / 2, [over]])
    points = points[points <= float(np.finfo(dtype).max)]
    exact = points.astype(dtype)
    return bool(
        np.array_equal(exact.astype(np.float64), points)
        and not (exact.view(uint) & uint.type((1 << low) - 1)).any()
    )


def _general(fmt: FloatFormat, x: np.ndarray, mode: Rounding, saturate: bool) -> np.ndarray:
    """The general chunk loop's codes of ``x`` (no NaN or sign checks)."""
    from lowbit.codecs.vectorised import _encode_general

    return _encode_general(fmt, x, mode, saturate, None, False, False)


def _representatives(dtype: np.dtype, unsigned_only: bool) -> np.ndarray:
    """One input of ``dtype`` per table entry: every bit pattern of a 16-bit input; for
    float32/float64, key ``k`` stands for the inputs whose top 16 bits are ``k >> 1``
    and whose lower bits are zero (``k`` even) or not (odd). ``unsigned_only`` clears the
    sign bit, for formats that refuse negative input before looking anything up."""
    if dtype in _KEYED:
        uint, low = _KEYED[dtype]
        keys = np.arange(1 << 17, dtype=uint)
        pattern = ((keys >> uint.type(1)) << uint.type(low)) | (keys & uint.type(1))
        sign = uint.type(1 << (8 * uint.itemsize - 1))
    else:
        uint = np.dtype(np.uint16)
        pattern = np.arange(1 << 16, dtype=np.uint32).astype(uint)
        sign = uint.type(0x8000)
    if unsigned_only:
        pattern &= ~sign
    return pattern.view(dtype)


def _table(fmt: FloatFormat, mode: Rounding, saturate: bool, dtype: np.dtype) -> np.ndarray:
    """Codes of every table entry for inputs of ``dtype``."""
    unsigned_only = not fmt.signed and not fmt.has_nan and not saturate
    return _general(fmt, _representatives(dtype, unsigned_only), mode, saturate)


def _pieces(n: int) -> list[tuple[int, int]]:
    from lowbit._parallel import threads

    parts = max(1, min(threads(), n // _PIECE))
    step = -(-n // parts)
    step = -(-step // _STEP) * _STEP  # whole steps per piece
    return [(a, min(a + step, n)) for a in range(0, n, step)] or [(0, 0)]


def _run(work: Any, n: int) -> list[Any]:
    """``work(a, b)`` over pieces of ``range(n)``, on threads when there are several."""
    from lowbit._parallel import map_chunks

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
    table: np.ndarray, x: np.ndarray, out: np.ndarray, nan_check: bool, neg_check: bool
) -> tuple[bool, bool]:
    """Codes of float32/float64 ``x`` into ``out``: the table entry of each input's key,
    its top 16 bits rounded to odd (``(bits >> (low - 1)) | (lower bits != 0)``)."""
    uint, low = _KEYED[x.dtype]
    u = x.view(uint)
    shift, mask, one = uint.type(low - 1), uint.type((1 << (low - 1)) - 1), uint.type(1)
    key = np.empty(min(_CHUNK, u.size), dtype=uint)
    sticky = np.empty_like(key)
    seen_nan = seen_neg = False
    for a in range(0, u.size, _CHUNK):
        uc = u[a : a + _CHUNK]
        k, s = key[: uc.size], sticky[: uc.size]
        np.right_shift(uc, shift, out=k)
        np.bitwise_and(uc, mask, out=s)
        np.minimum(s, one, out=s)
        np.bitwise_or(k, s, out=k)
        np.take(table, k, out=out[a : a + uc.size], mode="clip")  # keys are < table.size
        has_nan, has_neg = _flags(x[a : a + _CHUNK], nan_check, neg_check)
        seen_nan |= has_nan
        seen_neg |= has_neg
    return seen_nan, seen_neg


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
    fmt: FloatFormat, peer: np.dtype, saturate: bool, x: np.ndarray, out: np.ndarray
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


def _cast_peer(fmt: FloatFormat, mode: Rounding) -> np.dtype | None:
    """The dtype whose float32 cast is lowbit's encode of ``fmt``, or None."""
    ieee = fmt.signed and fmt.subnormals and fmt.inf is Inf.IEEE and fmt.nan is NaN.IEEE
    if mode is not Rounding.NEAREST_EVEN or not ieee:
        return None
    return _CAST_LAYOUTS.get((fmt.ebits, fmt.mbits, fmt.bias))


def encode(
    fmt: FloatFormat,
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
    if mode is Rounding.STOCHASTIC or x.dtype not in (_F64, _F32, _F16, _BF16):
        return None
    if np.dtype(fmt.code_dtype) not in (np.uint8, np.uint16) or fmt.bits > 16:
        return None
    out = np.empty(x.size, dtype=fmt.code_dtype)
    key = (fmt, mode, bool(saturate), x.dtype)
    peer = _cast_peer(fmt, mode) if x.dtype == _F32 else None
    if peer is not None and not neg_check:
        flags = _run(lambda a, b: _cast_encode(fmt, peer, saturate, x[a:b], out[a:b]), x.size)
    else:
        if x.dtype in _KEYED and not on_key_grid(fmt, x.dtype):
            return None
        if not _worth_a_table(key, x.size):
            return None  # a few values: the general loop is quicker than building a table
        table = _cached(key, lambda: _table(fmt, mode, saturate, x.dtype))
        step = _keyed_encode if x.dtype in _KEYED else _lookup_encode
        flags = _run(lambda a, b: step(table, x[a:b], out[a:b], nan_check, neg_check), x.size)
    from lowbit.codecs.vectorised import nan_error, negative_error

    if nan_check and any(f[0] for f in flags):
        raise nan_error(fmt)
    if neg_check and any(f[1] for f in flags):
        raise negative_error(fmt)
    return out


def decode(fmt: FloatFormat, codes: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Values of validated codes (uint8/uint16/intp) of a format of at most 16 bits,
    looked up in ``table`` (``vectorised.value_table``), in chunks."""
    if codes.ndim == 0 or codes.size < _CHUNK:
        return np.take(table, codes)
    flat = np.ascontiguousarray(codes).reshape(-1)
    out = np.empty(flat.size, dtype=table.dtype)
    bf16 = flat.dtype == np.uint16 and _cast_peer(fmt, Rounding.NEAREST_EVEN) == _BF16
    if table.dtype == _F32 and bf16:
        nan_bits = table.view(np.uint32)[fmt.nan_code]  # the table's quiet NaN

        def cast(a: int, b: int) -> None:
            for c in range(a, b, _STEP):
                part = out[c : min(c + _STEP, b)]
                np.copyto(part, flat[c : c + part.size].view(_BF16), casting="unsafe")
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
