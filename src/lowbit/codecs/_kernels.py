"""The numba kernels behind ``lowbit.codecs._numba`` (codecs) and ``lowbit.quant._numba`` (tensors).

Only definitions live here: the rounding cores (``_round64`` on float64 fields,
``_round32`` in 32-bit lanes), the shared tail ``_finish``, the encode loops built per
rounding mode and format kind (``_kernel``), and the decode loops. ``lowbit.codecs._numba``
explains the algorithms and chooses which kernel runs; this module is imported only
where numba is installed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir as _llir
from numba import njit, types
from numba.extending import intrinsic

# Format kinds, for compile-time specialisation: any format; signed with subnormals;
# unsigned without subnormals or zero (E8M0-like)
_GENERIC, _SIGNED, _NOZERO = 0, 1, 2

# numba widens scalar integer arithmetic to 64 bits; the float32 core casts back to 32
# bits after each step so LLVM keeps 32-bit lanes (twice as many per vector). LLVM
# cannot narrow a shift by a run-time amount that way (a 64-bit shift by 32 or more is
# defined, a 32-bit one is not), so those go through ``_shl32``/``_shr32``.
_U = np.uint32
_I = np.int32
_ONE = np.uint64(1)
_ZERO = np.uint64(0)
_U52 = np.uint64(52)
_U63 = np.uint64(63)
_U64 = np.uint64(64)
_ABS64 = np.uint64((1 << 63) - 1)
_INF64 = np.uint64(0x7FF << 52)
_MANT64 = np.uint64((1 << 52) - 1)
_IMPLICIT64 = np.uint64(1 << 52)


def _bitcast(src: Any, dst: Any, llvm_type: Any, doc: str) -> Any:
    """An intrinsic reinterpreting a ``src`` scalar's bits as ``dst`` (a register bitcast)."""

    def impl(typingctx: Any, x: Any) -> Any:
        if x != src:
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return builder.bitcast(args[0], llvm_type)

        return dst(src), codegen

    impl.__doc__ = doc
    return intrinsic(impl)


_bits64 = _bitcast(types.float64, types.uint64, _llir.IntType(64), "float64 bits as uint64")
_bits32 = _bitcast(types.float32, types.uint32, _llir.IntType(32), "float32 bits as uint32")
_f32_of = _bitcast(types.uint32, types.float32, _llir.FloatType(), "the float32 of uint32 bits")


def _shift32(op: str, doc: str) -> Any:
    """An intrinsic shifting a uint32 by a uint32 amount below 32 in a 32-bit lane.

    numba shifts in 64 bits, and LLVM keeps that width when the amount is a run-time
    value: a vectorised loop then widens every lane to 64 bits and back around each
    shift. That made the float32 encode loops take about 1.6x as long as with this.
    """

    def impl(typingctx: Any, x: Any, k: Any) -> Any:
        if x != types.uint32 or k != types.uint32:
            return None

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return getattr(builder, op)(args[0], args[1])

        return types.uint32(types.uint32, types.uint32), codegen

    impl.__doc__ = doc
    return intrinsic(impl)


_shl32 = _shift32("shl", "``x << k`` for uint32 ``x`` and ``k`` < 32, in 32 bits")
_shr32 = _shift32("lshr", "``x >> k`` for uint32 ``x`` and ``k`` < 32, in 32 bits")


@njit(inline="always")
def _increment64(sig, k, neg, mode):  # type: ignore[no-untyped-def]
    """What to add to ``sig`` before dropping its ``k`` low bits to round in ``mode``."""
    if mode == 0:
        return ((_ONE << (k - _ONE)) - _ONE) + ((sig >> k) & _ONE)
    if mode == 1:
        return _ONE << (k - _ONE)
    if mode == 3:
        return _ZERO if neg else (_ONE << k) - _ONE
    if mode == 4:
        return (_ONE << k) - _ONE if neg else _ZERO
    return _ZERO


@njit(inline="always")
def _increment32(sig, k, neg, mode):  # type: ignore[no-untyped-def]
    """``_increment64`` in 32-bit lanes (uint32 ``k``, 1 <= k <= 31)."""
    one = _U(1)
    if mode == 0:
        return _U(_U(_shl32(one, _U(k - one)) - one) + _U(_shr32(sig, k) & one))
    if mode == 1:
        return _shl32(one, _U(k - one))
    if mode == 3:
        return _U(0) if neg else _U(_shl32(one, k) - one)
    if mode == 4:
        return _U(_shl32(one, k) - one) if neg else _U(0)
    return _U(0)


@njit(inline="always")
def _in_zone_up(a, neg, thr, direction):  # type: ignore[no-untyped-def]
    """Whether a value below the smallest positive rounds up to it (see _zone_rule)."""
    ok = (direction == 0) | ((direction == 1) & (not neg)) | ((direction == 2) & neg)
    return (a >= thr) & ok


@njit(inline="always")
def _round64(u, r, P, mode, maxc):  # type: ignore[no-untyped-def]
    """Magnitude code (int32, capped at maxc + 1) of float64 bits ``u``: the chunk
    algorithm, ``sig * 2**ex`` rounded once onto the grid ``2**(eff - mbits)``."""
    m, bias, emin, zone_end, thr, direction = P
    neg = (u >> _U63) != _ZERO
    a = u & _ABS64
    E = np.int64(a >> _U52)
    F = a & _MANT64
    sub = E == 0
    sig = (F << _ONE) if sub else ((F | _IMPLICIT64) << _ONE)
    ex = np.int64(-1075) if sub else E - 1076
    e = np.int64(-1075) if sub else E - 1023
    eff = max(e, emin)
    shift = eff - m - ex  # >= 1 since mbits <= 52
    big = shift > 62
    su = np.uint64(min(shift, 62))
    sg = (_ONE if sig != _ZERO else _ZERO) if big else sig  # beyond 62: a sticky bit
    if mode == 5:
        fl = sg >> su
        if big:  # ceil(sig * 2**(64 - shift)), saturating
            k = shift - 64
            if k <= 0:
                thr_r = sig << np.uint64(-k)
            elif k < 64:
                kk = np.uint64(k)
                thr_r = (sig + ((_ONE << kk) - _ONE)) >> kk
            else:
                thr_r = _ONE if sig != _ZERO else _ZERO
        else:
            thr_r = (sg & ((_ONE << su) - _ONE)) << (_U64 - su)
        n = np.int64(fl) + (1 if r < thr_r else 0)
    else:
        n = np.int64((sg + _increment64(sg, su, neg, mode)) >> su)
    mag = _I(min(((eff + bias - 1) << m) + n, maxc + 1))
    if a < np.uint64(zone_end):
        mag = _I(1) if _in_zone_up(a, neg, np.uint64(thr), direction) else _I(0)
    return mag, neg, a, a > _INF64, a == _INF64


@njit(inline="always")
def _round32(x, P, mode, kind):  # type: ignore[no-untyped-def]
    """``_round64`` on a float32 ``x`` in 32-bit lanes (deterministic modes)."""
    d, rebias, odd, normal_from, sub_shift, sub_offset, magic, zone_end, thr, direction = P
    u = _bits32(x)
    neg = (u >> _U(31)) != _U(0)
    a = _U(u & _U(0x7FFFFFFF))
    du = _U(d)
    # the format's normal range: drop d mantissa bits; a carry moves into the exponent
    t = _U(a | _U(_U(odd) << du))
    hi = _I(_I(_shr32(_U(a + _increment32(t, du, neg, mode)), du)) - _I(rebias))
    if mode == 0:
        # below it the grid is uniform, spacing 2**(emin-m): adding 2**(emin-m+23)
        # makes the float32 adder round onto it, ties to even
        big = _bits32(abs(x) + _f32_of(_U(magic)))
        lo = _I(_I(_I(big) - _I(magic)) + _I(sub_offset))
    else:
        E = _I(a >> _U(23))
        sig = _U(_U(a & _U(0x7FFFFF)) | (_U(0x800000) if E != 0 else _U(0)))
        # 1..31 in every lane (lanes on the normal-range path are discarded below)
        sh = _U(min(max(_I(sub_shift) - max(E, _I(1)), _I(1)), _I(31)))
        lo = _I(_I(_shr32(_U(sig + _increment32(sig, sh, neg, mode)), sh)) + _I(sub_offset))
    mag = hi if a >= _U(normal_from) else lo
    if kind == _NOZERO:
        if a < _U(zone_end):
            mag = _I(0)  # below the smallest value, and there is no zero
    elif kind != _SIGNED and a < _U(zone_end):
        mag = _I(1) if _in_zone_up(a, neg, _U(thr), direction) else _I(0)
    return mag, neg, a, a > _U(0x7F800000), a == _U(0x7F800000)


@njit(inline="always")
def _finish(mag, neg, nonzero, isnan, isinf, T, mode, kind):  # type: ignore[no-untyped-def]
    """The code (uint32) from a rounded magnitude (int32): overflow, sign, infinities,
    NaN, the unsigned rules. ``kind`` (a compile-time constant) drops the signed or
    the unsigned rules where the format cannot need them."""
    (
        maxc,
        sbit,
        keeps_sign,
        signed,
        nan_pos,
        nan_neg,
        blown_pos,
        blown_neg,
        unsigned_neg,
        no_zero,
    ) = T
    ovf = mag > _I(maxc)
    tz_like = (mode == 2) | ((mode == 3) & neg) | ((mode == 4) & (not neg))
    if ovf & tz_like:
        mag = _I(maxc)
    blown = isinf | (ovf & (not tz_like))
    code = _U(mag)
    if kind == _NOZERO:  # unsigned: negatives have no code but NaN (or 0, saturating)
        if blown:
            code = _U(blown_pos)
        if neg & nonzero & (not isnan):
            code = _U(unsigned_neg)
        if isnan:
            code = _U(nan_pos)
        return code
    if kind == _SIGNED or signed != 0:
        if neg & ((mag != _I(0)) | (keeps_sign != 0)):
            code = _U(code | _U(sbit))
    if blown:
        code = _U(blown_neg) if neg else _U(blown_pos)
    if kind != _SIGNED and (signed == 0) & neg & nonzero & (not isnan):
        code = _U(unsigned_neg) if ((mag != _I(0)) | blown | (no_zero != 0)) else _U(0)
    if isnan:
        code = _U(nan_neg) if neg else _U(nan_pos)
    return code


@njit(inline="always")
def _loop64(x, out, rbits, P, T, mode):  # type: ignore[no-untyped-def]
    """Encode ``x``; return whether it holds a NaN."""
    amax = _ZERO
    r = _ZERO
    maxc = T[0]
    for i in range(x.size):
        if mode == 5:
            r = rbits[i]
        mag, neg, a, isnan, isinf = _round64(_bits64(np.float64(x[i])), r, P, mode, maxc)
        out[i] = _finish(mag, neg, a != _ZERO, isnan, isinf, T, mode, _GENERIC)
        amax = max(amax, a)
    return amax > _INF64


@njit(inline="always")
def _loop32(x, out, P, T, mode, kind):  # type: ignore[no-untyped-def]
    """Encode float32 ``x``; return whether it holds a NaN."""
    amax = _U(0)
    for i in range(x.size):
        mag, neg, a, isnan, isinf = _round32(x[i], P, mode, kind)
        out[i] = _finish(mag, neg, a != _U(0), isnan, isinf, T, mode, kind)
        amax = max(amax, a)
    return amax > _U(0x7F800000)


@njit(inline="always")
def _loop32_wide(x, out, W, mode):  # type: ignore[no-untyped-def]
    """Encode float32 ``x`` to a format with float32's exponent field (bfloat16, TF32):
    the rounded bit pattern shifted right is the code, sign and carries included;
    only NaN and (under ``saturate``) overflow need patching."""
    d, maxc, saturate, nan_code, mb = W
    du = _U(d)
    mask = _U(_U(_U(1) << _U(mb)) - _U(1))
    for i in range(x.size):
        u = _bits32(x[i])
        neg = (u >> _U(31)) != _U(0)
        sign = _shl32(_U(u >> _U(31)), _U(mb))
        c = _shr32(_U(u + _increment32(u, du, neg, mode)), du)
        if (saturate != 0) & (_U(c & mask) > _U(maxc)):
            c = _U(_U(maxc) | sign)
        if _U(u & _U(0x7FFFFFFF)) > _U(0x7F800000):
            c = _U(_U(nan_code) | sign)
        out[i] = c
    return False


# Kernels are built on first use, per format kind and for nearest-even (the default)
# on their own: the mode and kind tests then fold away and the loop vectorises. The
# other deterministic modes share one kernel that reads the mode at run time (``mode``
# -1), as do all modes on the float64 core but stochastic: each kernel costs about a
# second to compile.
_KERNELS: dict[tuple[str, int, int], Any] = {}


@njit(inline="always")
def _int_loop(x, out, rbits, mode, wrap, lo, hi, nbits):  # type: ignore[no-untyped-def]
    """Integer codes of float32/float64 ``x`` (``intformat.round_to_integer`` and the
    clamp or wrap of ``IntFormat.encode``, per element); return whether a NaN was
    seen (it encodes as 0). Written with floor only (no fmod) so that it vectorises;
    every step is exact on integer-valued doubles."""
    seen_nan = False
    modulus = float(1 << nbits)
    mask = np.uint64((1 << nbits) - 1)
    for i in range(x.size):
        v = np.float64(x[i])
        isnan = v != v
        seen_nan |= isnan
        if isnan:
            v = 0.0
        ax = abs(v)
        finite = ax < np.inf
        afl = np.floor(ax) if finite else 0.0
        afrac = ax - afl if finite else 0.0  # exact on the magnitude
        if mode == 0:
            odd = afl - 2.0 * np.floor(afl * 0.5) == 1.0
            away = (afrac > 0.5) | ((afrac == 0.5) & odd)
        elif mode == 1:
            away = afrac >= 0.5
        elif mode == 2:
            away = False
        elif mode == 3:
            away = (afrac > 0.0) & (v > 0.0)
        elif mode == 4:
            away = (afrac > 0.0) & (v < 0.0)
        else:
            thr = np.uint64(np.ceil(afrac * 18446744073709551616.0))  # afrac * 2**64
            away = (afrac > 0.0) & (rbits[i] < thr)
        r = np.copysign(afl + (1.0 if away else 0.0), v) if finite else v
        if wrap:
            if not finite:
                r = hi if r > 0 else lo
            out[i] = np.uint64(r - modulus * np.floor(r / modulus))  # r mod 2**nbits
        else:
            r = min(max(r, lo), hi)
            out[i] = np.uint64(np.int64(r)) & mask
    return seen_nan


def _kernel(path: str, mode: int, kind: int) -> Any:
    key = (path, mode, kind)
    k = _KERNELS.get(key)
    if k is None:
        k = _KERNELS[key] = _build(path, mode, kind)
    return k


def _build(path: str, mode: int, kind: int) -> Any:
    # closures: numba caches each by its constant cell values (mode, kind)
    if path == "64":

        @njit(cache=True, nogil=True)
        def enc64(x, out, rbits, P, T, rmode):  # type: ignore[no-untyped-def]
            md = mode if mode >= 0 else rmode
            return _loop64(x, out, rbits, P, T, md)

        return enc64
    if path == "int":

        @njit(cache=True, nogil=True)
        def enc_int(x, out, rbits, rmode, wrap, lo, hi, nbits):  # type: ignore[no-untyped-def]
            md = mode if mode >= 0 else rmode
            return _int_loop(x, out, rbits, md, wrap, lo, hi, nbits)

        return enc_int
    if path == "wide":

        @njit(cache=True, nogil=True)
        def enc_wide(x, out, W, rmode):  # type: ignore[no-untyped-def]
            md = mode if mode >= 0 else rmode
            return _loop32_wide(x, out, W, md)

        return enc_wide

    @njit(cache=True, nogil=True)
    def enc32(x, out, P, T, rmode):  # type: ignore[no-untyped-def]
        md = mode if mode >= 0 else rmode
        return _loop32(x, out, P, T, md, kind)

    return enc32


@njit(cache=True, nogil=True)
def _pack4_kernel(c, out):  # type: ignore[no-untyped-def]
    """Two 4-bit codes per byte, element 0 in the low nibble (``packing``'s order)."""
    for i in range(c.size // 2):
        out[i] = np.uint8(c[2 * i] | (c[2 * i + 1] << np.uint8(4)))


@njit(cache=True, nogil=True)
def _take_kernel(table, codes, out):  # type: ignore[no-untyped-def]
    """``out[i] = table[codes[i]]`` (tables and out as unsigned ints of one width)."""
    for i in range(codes.size):
        out[i] = table[codes[i]]


@njit(cache=True, nogil=True)
def _ieee_decode(codes, out, P):  # type: ignore[no-untyped-def]
    """float32 bits of IEEE-style codes by arithmetic (no table): normal codes shift
    into place and rebias, subnormals scale, inf and NaN (quiet, no payload, signed)
    are patched: the values of ``decode_float_arith``."""
    m, mb, rebias, scale_bits, emax = P
    mu = _U(m)
    scale = _f32_of(_U(scale_bits))
    mant_mask = _U(_U(_U(1) << mu) - _U(1))
    mag_mask = _U(_U(_U(1) << _U(mb)) - _U(1))
    to_place = _U(23 - m)
    for i in range(codes.size):
        c = _U(codes[i])
        sign = _U(_shr32(c, _U(mb)) << _U(31))
        mag = _U(c & mag_mask)
        e = _shr32(mag, mu)
        mant = _U(mag & mant_mask)
        v = _U(_shl32(mag, to_place) + _U(rebias))
        if e == _U(0):
            v = _bits32(np.float32(mant) * scale)
        if e == _U(emax):
            v = _U(0x7FC00000) if mant != _U(0) else _U(0x7F800000)
        out[i] = _U(v | sign)


@njit(cache=True, nogil=True)
def _e8m0_decode(codes, out):  # type: ignore[no-untyped-def]
    """float32 bits of E8M0 codes: 2**(c - 127) is the code as float32's exponent
    field; code 0 (2**-127) is a float32 subnormal and 255 the NaN."""
    for i in range(codes.size):
        c = _U(codes[i])
        v = _U(c << _U(23))
        if c == _U(0):
            v = _U(0x00400000)
        if c == _U(255):
            v = _U(0x7FC00000)
        out[i] = v


@njit(cache=True, nogil=True)
def _wide_decode(codes, out, d):  # type: ignore[no-untyped-def]
    """float32 bits of bfloat16/TF32 codes: shift left by ``d``; NaN -> +-quiet NaN."""
    du = _U(d)
    for i in range(codes.size):
        v = _shl32(_U(codes[i]), du)
        f = _f32_of(v)
        if f != f:  # the table's NaN: quiet, no payload, the code's sign
            v = _U(_U(v & _U(0x80000000)) | _U(0x7FC00000))
        out[i] = v
