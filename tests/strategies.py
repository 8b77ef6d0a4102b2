"""Hypothesis strategies shared by the test files: formats, layouts, inputs, modes."""

from __future__ import annotations

import contextlib
import functools
import math

import numpy as np
from hypothesis import strategies as st

import lowbit
from lowbit import FloatFormat, IntFormat, LowbitError, ValueSetFormat

ROUNDINGS = (
    "nearest_even",
    "nearest_away",
    "toward_zero",
    "toward_positive",
    "toward_negative",
    "stochastic",
)
DETERMINISTIC = ROUNDINGS[:5]

CATALOG_FLOATS = sorted(n for n, f in lowbit.FORMATS.items() if isinstance(f, FloatFormat))
CATALOG_INTS = sorted(n for n, f in lowbit.FORMATS.items() if isinstance(f, IntFormat))
CATALOG_VALUESETS = sorted(n for n, f in lowbit.FORMATS.items() if isinstance(f, ValueSetFormat))

roundings = st.sampled_from(ROUNDINGS)
deterministic_roundings = st.sampled_from(DETERMINISTIC)
random_bits = st.integers(min_value=0, max_value=2**64 - 1)

# (inf, nan) pairs FloatFormat accepts (IEEE NaNs need a mantissa bit; IEEE infinities
# without NaNs need none): checked again by building the format.
_SPECIALS = [
    ("ieee", "ieee"),
    ("none", "ieee"),
    ("ieee", "none"),
    ("none", "none"),
    ("none", "high"),
    ("high", "high"),
    ("none", "neg_zero"),
    ("high", "neg_zero"),
    ("high", "none"),
]


@st.composite
def float_layouts(draw: st.DrawFn, max_bits: int = 16) -> FloatFormat:
    """A random valid custom FloatFormat of at most ``max_bits`` bits."""
    signed = draw(st.booleans())
    ebits = draw(st.integers(0, min(8, max_bits - int(signed))))
    mbits = draw(st.integers(0 if ebits else 1, min(10, max_bits - int(signed) - ebits)))
    inf, nan = draw(st.sampled_from(_SPECIALS))
    default_bias = (1 << (ebits - 1)) - 1 if ebits else 0
    bias = default_bias + draw(st.integers(-3, 3))
    subnormals = draw(st.booleans())
    try:
        return FloatFormat(
            name=f"custom_e{ebits}m{mbits}",
            ebits=ebits,
            mbits=mbits,
            bias=bias,
            signed=signed,
            inf=inf,
            nan=nan,
            subnormals=subnormals,
        )
    except LowbitError:
        from hypothesis import assume

        assume(False)
        raise  # unreachable


def catalog(kind: type | None = None, max_bits: int = 64) -> st.SearchStrategy:
    """A catalog format (optionally of one class) of at most ``max_bits`` bits."""
    names = [
        n
        for n, f in lowbit.FORMATS.items()
        if (kind is None or isinstance(f, kind)) and f.bits <= max_bits
    ]
    return st.sampled_from(sorted(names)).map(lowbit.format)


def float_formats(max_bits: int = 64) -> st.SearchStrategy[FloatFormat]:
    """Catalog float formats and random custom layouts."""
    return st.one_of(catalog(FloatFormat, max_bits), float_layouts(min(max_bits, 16)))


def formats(max_bits: int = 64) -> st.SearchStrategy:
    """Any format: floats (catalog and custom), integers, value sets."""
    return st.one_of(
        float_formats(max_bits), catalog(IntFormat, max_bits), catalog(ValueSetFormat, max_bits)
    )


any_float64 = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True, width=64)
finite_float64 = st.floats(allow_nan=False, allow_infinity=False, width=64)


@st.composite
def values_near(draw: st.DrawFn, fmt: lowbit.Format) -> float:
    """A float64 near the interesting points of ``fmt``: its values, midpoints, its
    range ends, a few float64 steps away, scaled by powers of two, or anything at all."""
    how = draw(st.integers(0, 4))
    if how == 0:
        return draw(any_float64)
    anchors = [fmt.max, fmt.smallest_positive, fmt.smallest_normal, 1.0, 0.0]
    if fmt.bits <= 16:
        vals = fmt.values()
        anchors.extend(float(v) for v in vals[:: max(1, vals.size // 64)])
    a = draw(st.sampled_from(anchors))
    if how == 1:  # a few float64 steps around an anchor
        for _ in range(draw(st.integers(0, 3))):
            a = math.nextafter(a, draw(st.sampled_from([math.inf, -math.inf])))
    elif how == 2:  # a fraction of the way to a neighbour scale
        a = a * draw(st.sampled_from([0.5, 0.75, 1.0, 1.25, 1.5, 1.0625, 0.96875, 2.0, 3.0]))
    elif how == 3:
        try:
            a = math.ldexp(a, draw(st.integers(-8, 8)))
        except OverflowError:
            a = math.inf
    sign = draw(st.sampled_from([1.0, -1.0]))
    return sign * a


@st.composite
def input_arrays(draw: st.DrawFn, fmt: lowbit.Format, dtype: np.dtype) -> np.ndarray:
    """A small array of ``dtype`` (float64/float32/float16/bfloat16) for encoding into
    ``fmt``: values near its points (``values_near``) moved a few steps of ``dtype`` either
    way, raw bit patterns (subnormals, NaNs with payloads, infinities), huge values."""
    dtype = np.dtype(dtype)
    uint = np.dtype(f"u{dtype.itemsize}")
    n = draw(st.integers(1, 24))
    out = []
    for _ in range(n):
        how = draw(st.integers(0, 2))
        if how == 0:
            raw = draw(st.integers(0, (1 << (8 * dtype.itemsize)) - 1))
            out.append(np.array(raw, dtype=uint).view(dtype))
            continue
        with np.errstate(over="ignore"):
            v = np.array(draw(values_near(fmt)) if how == 1 else draw(any_float64)).astype(dtype)
        for _ in range(draw(st.integers(0, 2))):
            if dtype.itemsize >= 4:
                with np.errstate(over="ignore"):  # max -> inf
                    v = np.nextafter(v, dtype.type(draw(st.sampled_from([np.inf, -np.inf]))))
            else:  # no nextafter for the 16-bit types: step the bit pattern
                step = draw(st.sampled_from([1, 0xFFFF]))
                v = np.array((int(v.view(uint)) + step) & 0xFFFF, dtype=uint).view(dtype)
        out.append(v)
    return np.array(out, dtype=dtype).reshape(-1)


# ---- helpers the test files share (not strategies, but they belong with them) ---------

CODEC_PATHS = ("default", "numpy")


def codec_path(path: str) -> contextlib.AbstractContextManager:
    """A context in which the float codecs take ``path``: ``default`` (the compiled
    kernels where numba is installed, at any array size) or ``numpy`` (the numpy path)."""
    from lowbit.codecs import _numba as _fast

    if path == "numpy":
        return _fast.numpy_only()
    return _fast.kernels_always()


def bit_pattern(values: np.ndarray) -> np.ndarray:
    """float64 bit patterns, every NaN made the quiet NaN with its own sign bit (lowbit
    does not carry NaN payloads), so that -0.0 != 0.0 and NaN == NaN of the same sign."""
    v = np.asarray(values, dtype=np.float64)
    v = np.where(np.isnan(v), np.copysign(np.nan, v), v)
    return v.view(np.uint64)


@functools.cache
def reference_values(fmt: lowbit.Format) -> np.ndarray:
    """The reference's float64 value of every code of a format of at most 16 bits."""
    from lowbit.formats import reference

    n = len(fmt.table) if isinstance(fmt, ValueSetFormat) else 1 << fmt.bits
    out = np.array([reference.decode_float64(fmt, c) for c in range(n)], dtype=np.float64)
    out.setflags(write=False)
    return out


# ---- tensors and granularities for quantization (test_quant, test_mx) ----------------

QUANT_INTS = tuple(f"int{n}" for n in range(2, 9)) + tuple(f"uint{n}" for n in range(2, 9))


@st.composite
def quant_arrays(draw: st.DrawFn, max_dims: int = 3, max_side: int = 9) -> np.ndarray:
    """A small float32 tensor: normal, uniform, sparse, constant or integer-valued data at
    a random power-of-two magnitude (built from a drawn seed, so it stays cheap)."""
    shape = tuple(draw(st.lists(st.integers(1, max_side), min_size=1, max_size=max_dims)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    mag = 2.0 ** draw(st.integers(-24, 24))
    kind = draw(st.sampled_from(["normal", "uniform", "sparse", "const", "ints", "outlier"]))
    if kind == "normal":
        x = rng.standard_normal(shape)
    elif kind == "uniform":
        x = rng.uniform(-1, 1, shape)
    elif kind == "sparse":
        x = rng.standard_normal(shape) * (rng.random(shape) < 0.3)
    elif kind == "const":
        x = np.full(shape, draw(st.sampled_from([0.0, 1.0, -3.0])))
    elif kind == "ints":
        x = rng.integers(-8, 9, shape).astype(np.float64)
    else:
        x = rng.standard_normal(shape)
        x.reshape(-1)[rng.integers(0, x.size)] *= 100.0
    return (x * mag).astype(np.float32)


@st.composite
def granularities(draw: st.DrawFn, shape: tuple[int, ...]) -> dict:
    """Keyword arguments of ``lowbit.quantize`` for a random granularity valid for
    ``shape``: per tensor, per channel (any axis, negative too), or groups of any size
    along any axis (ragged last groups included)."""
    kind = draw(st.sampled_from(["tensor", "channel", "group"]))
    if kind == "tensor":
        return {}
    nd = len(shape)
    axis = draw(st.integers(-nd, nd - 1))
    if kind == "channel":
        return {"axis": axis}
    return {"axis": axis, "group_size": draw(st.integers(1, max(1, shape[axis] + 2)))}


@st.composite
def model_shapes(draw: st.DrawFn, max_tensors: int = 8) -> list[tuple[int, ...]]:
    """Shapes of a small model's tensors (1-D norms to 3-D expert stacks) for the planner."""
    dims = st.lists(st.integers(1, 300), min_size=1, max_size=3).map(tuple)
    return draw(st.lists(dims, min_size=1, max_size=max_tensors))


# JSON values a tampered file may hold where another was expected: every JSON type, the
# integers and floats at the edges (huge, negative, non-finite), strings that look like paths.
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 2**64, 10**300]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["", "..", "../x.safetensors", "/etc/passwd", "int8", "nf4", "quantized"]),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
