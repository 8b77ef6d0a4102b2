"""Optional compiled kernels (numba, the ``lowbit[fast]`` extra): bit for bit the numpy path.

Encoding runs ``_general._encode_chunk``'s single-rounding integer algorithm per element,
in one pass that also notes NaNs (for ``nan="raise"``). Two rounding cores feed one
shared tail:

- float64 fields (float32 or float64 input, every rounding mode): exactly the chunk
  algorithm; a float32 widens to float64 in a register, so no float64 copy is made;
- float32 fields (float32 input, deterministic modes, formats whose lowest binade is at
  or above 2**-127), in 32-bit lanes: "add the rounding increment, then shift" in the
  format's normal range, and below it the float32 adder rounding onto the uniform grid.
  A float32 carries 24 significant bits, so a shift capped at 31 loses no sticky bit.

The tail (overflow, infinities, NaN, sign, the unsigned rules) is reduced per format and
``saturate`` to a handful of codes, so the loops stay branch-free and vectorise. Formats
with float32's exponent field (bfloat16, TF32) have a kernel of their own: the rounded
float32 pattern shifted right is the code. Format parameters reach the kernels as tuples
of ints; kernels are specialised only on the rounding mode (nearest-even or not), a
coarse format kind, and the input and output dtypes, and built on first use.

Integer formats get one kernel (``round_to_integer``, then clamp or wrap). Decoding is a
lookup in the numpy path's own value table, or arithmetic for float16-like, bfloat16,
TF32 and E8M0 codes. Each entry point returns False/None when numba is missing or no
kernel applies, and the caller takes the numpy path. Where the caller's numpy path has a
fast route of its own (code tables, exact casts), the two are timed against each other
once per kind of kernel, on one thread, and the faster runs: on some CPUs (an Intel Xeon
with AMX, issue 28) the numpy path's table encodes faster than the kernels; the verdict is
cached per machine (``lowbit.codecs._path_choice``, docs/benchmarks.md). ``numpy_only()`` forces that path;
it exists so tests can compare the two (they agree bit for bit, so it never changes what
a caller gets). This module chooses and parameterises the kernels; their definitions
are in ``lowbit.codecs._kernels``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from functools import cache, lru_cache
from typing import Any

import numpy as np

from lowbit._parallel import Switch, map_chunks, serial, threads
from lowbit.codecs import _path_choice, _switch_log
from lowbit.codecs._common import nan_error, negative_error, value_table
from lowbit.errors import NaNPolicyError

# numba is the optional extra ``lowbit[fast]``. Importing it costs a good part of a second, so
# it is only looked for here; the kernels (and numba) load when the first one is used.
# ``LOWBIT_NUMBA=0`` in the environment turns the kernels off for the whole process, as if
# numba were not installed (what ``pip install lowbit`` without the extra runs; `make test`
# runs the suite once that way).
_OFF = ("0", "off", "false", "no")
HAVE_NUMBA = (
    importlib.util.find_spec("numba") is not None
    and os.environ.get("LOWBIT_NUMBA", "").strip().lower() not in _OFF
)


@cache
def _k() -> Any:
    """``lowbit.codecs._kernels``, imported (with numba) on first use."""
    from lowbit.codecs import _kernels  # needs numba, the optional extra

    return _kernels


_numpy_only = Switch()
_kernels_always = Switch()

# Arrays smaller than this take the numpy path: the same bits, in well under a millisecond
# per thousand values, where the first kernel costs importing numba (about half a second)
# and compiling or loading it from the cache (a second or more). A scalar or a value table
# never pays that.
MIN_KERNEL_SIZE = 1 << 16

#: Values a process sends down the numpy path before the kernels are worth loading. The
#: first kernel costs about 0.6 s of CPU (numba's import and loading the kernel from the
#: cache; more when it compiles), and the numpy path costs 1.5-6 ns per value more than a
#: kernel (one thread, int4 g128 4.2 against 1.2 ns, NF4 8.0 against 2.1, int8 per channel
#: 2.4 against 1.0, 16 M values on the AMD EPYC of docs/benchmarks.md): a one-off job on
#: fewer values (all-MiniLM-L6-v2's 10.6 M linear weights, a 1024 x 1024 array) finishes
#: sooner without numba, a long one pays the start once. The rule is the ski-rental one:
#: keep "renting" (the numpy path) until the rent paid is a fair share of the price, then
#: "buy" (load the kernels) and keep them; an array that alone crosses the line buys at once.
KERNEL_WORTH = 1 << 26


class _Rental:
    """The ski-rental choice between the numpy path and the kernels, for one process.

    ``take(n)`` says whether an array of ``n`` values goes to a kernel: once the kernels are
    bought (``loaded()`` true: numba imported, by lowbit or anyone, so a kernel costs only
    its load) always; otherwise when the values already sent down the numpy path plus ``n``
    reach ``worth``, which buys them. Counting is approximate under threads (a lost update
    only delays the purchase); both paths give the same bits, so the choice never changes a
    result.
    """

    def __init__(self, worth: int, loaded: Any) -> None:
        self.worth = worth
        self.loaded = loaded
        self.rented = 0
        self.bought = False

    def take(self, n: int) -> bool:
        if not self.bought and not self.loaded() and self.rented + n < self.worth:
            self.rented += n
            return False
        self.bought = True
        return True


def numba_loaded() -> bool:
    """Whether numba is imported in this process (by lowbit or anyone): a kernel then costs
    only its own load, not numba's start."""
    return "numba" in sys.modules


_rental = _Rental(KERNEL_WORTH, numba_loaded)

#: Which path is faster, per kind of kernel, on this machine (measured once, cached per
#: machine: ``lowbit.codecs._path_choice``).
_choice = _path_choice.PathChoice()


def _faster(kind: str, run: Any, numpy_path: Any, sample: np.ndarray, out_dtype: Any) -> bool:
    """Whether the kernel ``run(x, out)`` beats ``numpy_path(x)`` on this machine for
    ``kind``: measured once (on one thread, ``sample`` tiled to a few MB), then cached.
    Without a numpy fast route (``numpy_path`` None), or under ``kernels_always()``, yes."""
    if numpy_path is None or _kernels_always.on:
        return True

    def measure() -> tuple[float, float]:
        x = np.resize(sample, _path_choice.SAMPLE_VALUES)
        out = np.empty(x.size, dtype=out_dtype)
        with serial(), np.errstate(all="ignore"):
            return _path_choice.time_pair(lambda: run(x, out), lambda: numpy_path(x))

    return _choice.kernels_win(kind, measure)


def numpy_only() -> contextlib.AbstractContextManager[None]:
    """Within this block the codecs take the numpy path (for tests comparing the paths)."""
    return _numpy_only.set()


def kernels_always() -> contextlib.AbstractContextManager[None]:
    """Within this block the compiled kernels run on arrays of any size (for tests of the
    kernels, whose cases are mostly small); ``numpy_only()`` still wins."""
    return _kernels_always.set()


#: Called by :func:`taken` when set: `make test`'s first pass records which tests take a
#: branch they would not take with the kernels off (``lowbit.codecs._switch_log``; outside a
#: recording run: None).
consulted: Any = _switch_log.recorder()


def enabled() -> bool:
    """Whether the compiled kernels are in use (numba installed and not forced off). Every
    choice between a kernel and the numpy path reads this, per call (never at import), and
    calls :func:`taken` where its answer makes the call differ from a kernels-off run
    (``tests/codecs/test_kernel_switch.py`` keeps both true)."""
    return HAVE_NUMBA and not _numpy_only.on


def taken() -> None:
    """Note that this call takes a branch it would not take with the kernels off (a kernel,
    another chunk size): `make test` runs the tests that reach one again without the kernels
    (docs/architecture.md, "Testing"). Only notes; never changes a result."""
    if consulted is not None:
        consulted()


def use_kernels(n: int) -> bool:
    """Whether ``n`` elements go to a compiled kernel: ``enabled()``, and ``kernels_always()``
    on or ``n`` at least ``MIN_KERNEL_SIZE`` once the kernels are worth loading
    (:data:`KERNEL_WORTH`: numba already imported, or this process's numpy-path values plus
    ``n`` reach it). Both paths give the same bits."""
    if not enabled():
        return False
    if _kernels_always.on or (n >= MIN_KERNEL_SIZE and _rental.take(n)):
        taken()
        return True
    return False


_PIECE = 1 << 19  # elements per thread's piece of a large array (smaller: one thread)


def _split(call: Any, n: int) -> bool:
    """``call(a, b)`` over contiguous pieces ``[a, b)`` of ``range(n)``, on the threads of
    ``lowbit._parallel`` when there are at least two pieces of ``_PIECE`` elements; whether
    any call returned true (a NaN seen). Pieces are element ranges, so results do not
    depend on the split."""
    pieces = min(threads(), n // _PIECE)
    if pieces < 2:
        return bool(call(0, n))
    step = -(-n // pieces)
    return any(map_chunks(lambda a: call(a, min(a + step, n)), list(range(0, n, step))))


# ---- parameters (plain Python, cached per format) -----------------------------------

_OUT_DTYPES = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.uint32))
_IN_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
# Format kinds, for compile-time specialisation (the values of ``_kernels``' constants)
_GENERIC, _SIGNED, _NOZERO = 0, 1, 2


def _f64_bits(value: float) -> int:
    return int(np.array(value, dtype=np.float64).view(np.uint64))


def _f32_bits(value: float) -> int | None:
    """float32 bit pattern of ``value`` if it is exactly a float32, else None."""
    f = np.float32(value)
    return int(np.array(f).view(np.uint32)) if float(f) == value else None


def _zone_rule(fmt: Any, mode: int, half_bits: int, never: int) -> tuple[int, int]:
    """(threshold, direction) for values below the smallest positive of a format
    without subnormals: such a value rounds up to it iff its absolute bit pattern is
    >= threshold and direction allows (0 any sign, 1 positive only, 2 negative only);
    it becomes 0 otherwise (``_general._patch_no_subnormal_zone``)."""
    if not fmt.has_zero or mode == 2:
        return never, 0
    if mode == 0:
        return half_bits + 1, 0  # above the midpoint
    if mode == 1:
        return half_bits, 0  # at or above the midpoint
    return 1, 1 if mode == 3 else 2  # any non-zero value, toward the rounding direction


@lru_cache(maxsize=256)
def _tail_params(fmt: Any, saturate: bool) -> tuple[int, ...] | None:
    """The tail as codes, or None where no kernel applies: (max magnitude code, sign bit,
    whether a negative zero magnitude keeps its sign, signed, code of +NaN and -NaN input,
    code of positive and negative overflow/infinity, code of a negative value that has no
    unsigned code, whether a magnitude code 0 is non-zero)."""
    if np.dtype(fmt.code_dtype) not in _OUT_DTYPES:
        return None
    if not fmt.signed and fmt.has_inf and not fmt.has_nan:
        return None  # no code for -inf/negative overflow: left to the numpy path
    if fmt.max_code_magnitude >= (1 << 31) - 1:
        return None  # the tail works in int32
    maxc = fmt.max_code_magnitude
    sbit = 1 << fmt.magnitude_bits if fmt.signed else 0
    keeps_sign = fmt.has_negative_zero or not fmt.has_zero  # a zero magnitude keeps "-"
    nan_code = fmt.nan_code if fmt.nan_code is not None else 0
    # NaN codes keep the sign where the format's NaN has one (_general._signed_nan)
    nan_neg = nan_code | (sbit if fmt.nan.value in ("high", "ieee") else 0)
    if saturate or (not fmt.has_inf and not fmt.has_nan):
        # overflow and infinities clamp to ±max, signed as a finite result is
        pos = maxc
        neg = maxc | (sbit if (maxc != 0 or keeps_sign) else 0)
    elif fmt.has_inf:
        pos = fmt.inf_code
        neg = fmt.inf_code | sbit if fmt.signed else nan_code
    else:
        pos, neg = nan_code, nan_neg
    return (
        maxc,
        sbit,
        int(keeps_sign),
        int(fmt.signed),
        nan_code if fmt.has_nan else 0,
        nan_neg if fmt.has_nan else 0,
        pos,
        neg if fmt.signed else pos,
        0 if saturate else nan_code,
        int(not fmt.has_zero),
    )


@lru_cache(maxsize=512)
def _round64_params(fmt: Any, mode: int) -> tuple[int, ...]:
    """(mbits, bias, emin, zone end, zone threshold, zone direction) for float64 fields."""
    tiny = fmt.smallest_positive
    zone_end = 0 if fmt.subnormals else _f64_bits(tiny)
    thr, direction = _zone_rule(fmt, mode, _f64_bits(tiny / 2), (1 << 63) - 1)
    return (fmt.mbits, fmt.bias, fmt.emin, zone_end, thr, direction)


@lru_cache(maxsize=512)
def _round32_params(fmt: Any, mode: int) -> tuple[int, ...] | None:
    """Parameters of the float32-field core, or None where it does not apply.

    It needs the format's lowest binade at or above 2**-127 (``emin >= -127``) so that
    no float32 subnormal needs normalising, and at least one float32 mantissa bit
    below the kept ones in every binade.
    """
    m, bias, emin = fmt.mbits, fmt.bias, fmt.emin
    if mode == 5 or emin < -127 or m > min(22, emin + 148) or emin - m + 23 < -126:
        return None
    zone_end, thr, direction = 0, 0xFFFFFFFF, 0  # above every float32 that is not NaN
    if not fmt.subnormals:
        tiny32 = _f32_bits(fmt.smallest_positive)
        half32 = _f32_bits(fmt.smallest_positive / 2)
        if tiny32 is None or half32 is None:
            return None
        zone_end = tiny32
        thr, direction = _zone_rule(fmt, mode, half32, 0xFFFFFFFF)
    return (
        23 - m,  # bits dropped from a float32 mantissa in the format's normal range
        (127 - bias) << m,  # exponent rebias, in magnitude-code units
        int(m == 0),  # ties to even look at the significand 1.m, always odd when m == 0
        max((emin + 127) << 23, 1 << 23),  # first bit pattern of the normal-range path
        emin - m + 150,  # the shift of the low path is this minus max(E, 1)
        (emin + bias - 1) << m,  # the low path's code offset
        (emin - m + 150) << 23,  # 2**(emin - m + 23) as float32 bits (mode 0's low path)
        zone_end,
        thr,
        direction,
    )


@lru_cache(maxsize=256)
def _ieee_decode_params(fmt: Any) -> tuple[int, ...] | None:
    """Parameters of the arithmetic decode to float32 of 9- to 16-bit IEEE-style formats
    (float16 and the like), whose every value is a float32; else None."""
    ieee = (
        fmt.signed
        and fmt.subnormals
        and fmt.inf.value == "ieee"
        and fmt.nan.value == "ieee"
        and 8 < fmt.bits <= 16
        and 1 <= fmt.mbits <= 23
        and 1 - fmt.bias - fmt.mbits >= -149
        and (1 << fmt.ebits) - 2 - fmt.bias <= 127
    )
    if not ieee:
        return None
    scale = _f32_bits(2.0 ** (1 - fmt.bias - fmt.mbits))  # a subnormal's unit
    assert scale is not None
    return (fmt.mbits, fmt.magnitude_bits, (127 - fmt.bias) << 23, scale, (1 << fmt.ebits) - 1)


def _is_e8m0(fmt: Any) -> bool:
    """The OCP MX scale layout: 8 exponent bits, bias 127, unsigned, NaN = 0xFF only."""
    return (fmt.ebits, fmt.mbits, fmt.bias, fmt.signed, fmt.subnormals) == (
        8, 0, 127, False, False
    ) and (fmt.inf.value, fmt.nan.value) == ("none", "high")  # fmt: skip


def _kind(fmt: Any) -> int:
    """Which tail rules a format can need (compile-time specialisation of the kernels)."""
    if fmt.signed and fmt.subnormals:
        return _SIGNED
    if not fmt.signed and not fmt.has_zero:
        return _NOZERO
    return _GENERIC


@lru_cache(maxsize=256)
def _wide_params(fmt: Any, saturate: bool) -> tuple[int, ...] | None:
    """Parameters of the kernel for formats with float32's exponent field, or None."""
    wide = (
        fmt.ebits == 8
        and fmt.bias == 127
        and fmt.signed
        and fmt.subnormals
        and fmt.inf.value == "ieee"
        and fmt.nan.value == "ieee"
        and 1 <= fmt.mbits <= 22
    )
    if not wide:
        return None
    return (23 - fmt.mbits, fmt.max_code_magnitude, int(saturate), fmt.nan_code, fmt.magnitude_bits)


def encode_float(
    fmt: Any,
    x: np.ndarray,
    mode: int,
    saturate: bool,
    rbits: np.ndarray | None,
    out: np.ndarray,
    *,
    nan_check: bool = False,
    neg_check: bool = False,
    numpy_path: Any = None,
) -> bool:
    """Fill ``out`` with the codes of ``x`` if a compiled kernel applies and is the faster
    path on this machine; else return False.

    Args:
        fmt: the FloatFormat.
        x: flat contiguous float32 or float64 input.
        mode: rounding mode index (``codec._MODE_INDEX``).
        saturate: clamp overflow and infinities to ±max.
        rbits: flat uint64 random bits (stochastic rounding) or None.
        out: flat array of ``fmt.code_dtype`` to fill.
        nan_check: raise NaNPolicyError if ``x`` holds a NaN.
        neg_check: raise LowbitError if ``x`` holds a negative value.
        numpy_path: the numpy path's fast route for this call (``x`` -> codes), where one
            applies: the kernel is used only if it is the faster of the two on this
            machine (:func:`_faster`).

    Raises:
        NaNPolicyError, LowbitError: as ``codec.encode_float`` does for the same input.
    """
    if not use_kernels(x.size) or x.dtype not in _IN_DTYPES or out.dtype != fmt.code_dtype:
        return False
    saturate = bool(saturate)
    tail = _tail_params(fmt, saturate)
    if tail is None or (mode == 5 and not fmt.subnormals and fmt.has_zero):
        return False  # the stochastic zone of such formats needs exact fractions
    kmode = 0 if mode == 0 else -1
    wide = _wide_params(fmt, saturate) if x.dtype == np.float32 and mode != 5 else None
    p32 = _round32_params(fmt, mode) if x.dtype == np.float32 and wide is None else None
    if wide is not None:
        family, k = "wide", _k()._kernel("wide", kmode, 0)

        def run(xs: np.ndarray, os_: np.ndarray) -> bool:
            return _split(lambda a, b: k(xs[a:b], os_[a:b], wide, mode), xs.size)
    elif p32 is not None:
        family, k = "32", _k()._kernel("32", kmode, _kind(fmt))

        def run(xs: np.ndarray, os_: np.ndarray) -> bool:
            return _split(lambda a, b: k(xs[a:b], os_[a:b], p32, tail, mode), xs.size)
    else:
        rb = np.zeros(1, dtype=np.uint64) if rbits is None else rbits
        kmode = 5 if mode == 5 else -1
        family, k = "64", _k()._kernel("64", kmode, 0)
        P64 = _round64_params(fmt, mode)

        def run(xs: np.ndarray, os_: np.ndarray) -> bool:
            return _split(
                lambda a, b: k(xs[a:b], os_[a:b], rb if rb.size == 1 else rb[a:b], P64, tail, mode),
                xs.size,
            )

    kind = f"encode {family} {x.dtype} {'nearest-even' if kmode == 0 else 'other modes'}"
    if not _faster(kind, run, numpy_path, x, out.dtype):
        return False
    has_nan = run(x, out)
    if nan_check and has_nan:
        raise nan_error(fmt)
    if neg_check and (x < 0).any():  # unsigned formats without NaN only: rare
        raise negative_error(fmt)
    return True


def encode_int(
    fmt: Any,
    x: np.ndarray,
    mode: int,
    wrap: bool,
    rbits: np.ndarray | None,
    out: np.ndarray,
    *,
    nan_check: bool,
) -> bool:
    """Fill ``out`` with the integer codes of ``x`` if a compiled kernel applies.

    Args:
        fmt: the IntFormat.
        x: flat contiguous float32 or float64 input.
        mode: rounding mode index (``codec._MODE_INDEX``).
        wrap: wrap modulo 2**bits (``saturate=False``) instead of clamping.
        rbits: flat uint64 random bits (stochastic rounding) or None.
        out: flat array of ``fmt.code_dtype`` to fill.
        nan_check: raise NaNPolicyError if ``x`` holds a NaN (else NaN encodes as 0).

    Raises:
        NaNPolicyError: as ``IntFormat.encode`` does.
    """
    if not use_kernels(x.size) or x.dtype not in _IN_DTYPES or out.dtype != fmt.code_dtype:
        return False
    if rbits is None:
        rbits = np.zeros(1, dtype=np.uint64)
    kernel = _k()._kernel("int", 0 if mode == 0 else -1, 0)
    rb = rbits
    lo, hi = float(fmt.min), float(fmt.max)
    seen_nan = _split(
        lambda a, b: kernel(
            x[a:b], out[a:b], rb if rb.size == 1 else rb[a:b], mode, bool(wrap), lo, hi, fmt.bits
        ),
        x.size,
    )
    if nan_check and seen_nan:
        raise NaNPolicyError(f"input contains NaN and {fmt.name} has no NaN code; pass nan='zero'")
    return True


def decode_float(fmt: Any, codes: np.ndarray, dtype: np.dtype, numpy_path: Any = None) -> Any:
    """Values of validated codes in ``dtype`` by a compiled loop, or None if none applies
    or the numpy path's route ``numpy_path`` (flat codes -> values; None: there is none)
    is the faster on this machine (:func:`_faster`).

    Formats of at most 16 bits: a lookup in ``codec.value_table`` (the numpy path's own
    table, so results are the same bits). To float32, some layouts skip the table:
    bfloat16 and TF32 (the code shifted into place), float16-like IEEE formats of 9-16
    bits (arithmetic) and E8M0 (the code is the exponent field), with NaNs made the
    table's canonical quiet NaN. The result has the codes' shape; 0-d codes of a format
    of at most 16 bits give a numpy scalar, as ``np.take`` on the numpy path does.
    """
    if not use_kernels(codes.size):
        return None
    if dtype == np.float32 and _wide_params(fmt, False) is not None:
        family, args = "wide", (_k()._wide_decode, fmt.code_dtype, np.float32, 23 - fmt.mbits)
    elif fmt.bits > 16:
        return None
    elif dtype == np.float32 and _is_e8m0(fmt):
        family, args = "e8m0", (_k()._e8m0_decode, np.uint8, np.float32)
    elif dtype == np.float32 and _ieee_decode_params(fmt) is not None:
        params = _ieee_decode_params(fmt)
        family, args = "ieee", (_k()._ieee_decode, np.uint16, np.float32, params)
    else:
        table = value_table(fmt, dtype)
        if table.itemsize not in (2, 4, 8):
            return None
        uint = np.dtype(f"u{table.itemsize}")
        narrow = np.uint8 if fmt.bits <= 8 and codes.dtype != np.uint16 else np.uint16
        family = f"table {np.dtype(narrow)}"
        args = (_k()._take_kernel, narrow, table.dtype, table.view(uint))
    kind = f"decode {family} {np.dtype(args[2])}"
    flat = np.ascontiguousarray(codes).reshape(-1)

    def run(c: np.ndarray, _out: np.ndarray) -> Any:
        return _decode_with(args[0], c, *args[1:])

    if not _faster(kind, run, numpy_path, flat, np.uint8):
        return None
    out = _decode_with(args[0], codes, *args[1:])
    return out[()] if out.ndim == 0 and fmt.bits <= 16 else out


def pack4(flat: np.ndarray) -> np.ndarray | None:
    """Two uint8 4-bit codes per byte, element 0 in the low nibble (``packing``'s order),
    for an even count; None where the kernel does not apply."""
    if not use_kernels(flat.size) or flat.dtype != np.uint8 or flat.size % 2 or flat.ndim != 1:
        return None
    out = np.empty(flat.size // 2, dtype=np.uint8)
    _k()._pack4_kernel(np.ascontiguousarray(flat), out)
    return out


def _decode_with(kernel: Any, codes: np.ndarray, code_dtype: Any, dtype: Any, *args: Any) -> Any:
    """Run a decode kernel over flat codes (narrowed to ``code_dtype``: validated, they
    fit) into a new array of ``dtype``, written through an unsigned view of its bits."""
    flat = np.ascontiguousarray(codes).reshape(-1)
    if flat.dtype != code_dtype:
        flat = flat.astype(code_dtype)
    out = np.empty(flat.size, dtype=dtype)
    if kernel is _k()._take_kernel:
        bits = out.view(args[0].dtype)
        _split(lambda a, b: kernel(args[0], flat[a:b], bits[a:b]), flat.size)
    else:
        bits = out.view(np.uint32)
        _split(lambda a, b: kernel(flat[a:b], bits[a:b], *args), flat.size)
    return out.reshape(codes.shape)
