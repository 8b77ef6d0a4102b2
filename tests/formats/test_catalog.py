"""The catalog: names and aliases, close matches for unknown names, derived properties
consistent with the value tables and with ml_dtypes / gfloat, the P3109 family."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from gfloat import Domain, Signedness, decode_float
from gfloat.formats import format_info_p3109

import lowbit
from lowbit import ALIASES, FORMATS, FloatFormat, IntFormat, LowbitError, UnknownFormatError

# ---- names --------------------------------------------------------------------------


def test_canonical_names_are_the_keys() -> None:
    """FORMATS maps each canonical name to the format of that name."""
    for name, fmt in FORMATS.items():
        assert fmt.name == name
        assert lowbit.format(name) is fmt
        assert lowbit.format(fmt) is fmt


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_aliases_any_case(alias: str) -> None:
    """Every alias resolves to its canonical format in any case, with - for _ and spaces."""
    target = FORMATS[ALIASES[alias]]
    for spelling in (alias, alias.upper(), alias.title(), f"  {alias} ", alias.replace("_", "-")):
        assert lowbit.format(spelling) is target


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("fp8", "float8_e4m3fn"),
        ("e4m3", "float8_e4m3fn"),
        ("fp8_e5m2", "float8_e5m2"),
        ("bf16", "bfloat16"),
        ("fp16", "float16"),
        ("half", "float16"),
        ("tf32", "tensorfloat32"),
        ("fp4", "float4_e2m1fn"),
        ("e8m0", "float8_e8m0fnu"),
        ("FP6_E2M3", "float6_e2m3fn"),
        ("NF4", "nf4"),
        ("INT4", "int4"),
    ],
)
def test_common_names(alias: str, name: str) -> None:
    """The short names people type map to the ml_dtypes/torch vocabulary."""
    assert lowbit.format(alias).name == name


@pytest.mark.parametrize(
    ("typo", "suggestion"),
    [
        ("fp9_e4m3", "fp8_e4m3"),
        ("bflaot16", "bfloat16"),
        ("float8_e4m3f", "float8_e4m3fn"),
        ("int44", "int4"),
    ],
)
def test_unknown_name_lists_close_matches(typo: str, suggestion: str) -> None:
    """An unknown name raises UnknownFormatError (a LowbitError and KeyError) naming close
    matches, printed without KeyError's quotes."""
    with pytest.raises(UnknownFormatError) as info:
        lowbit.format(typo)
    message = str(info.value)
    assert suggestion in message and typo in message and "did you mean" in message
    assert not message.startswith('"')
    assert isinstance(info.value, LowbitError) and isinstance(info.value, KeyError)


def test_unknown_name_without_matches_and_non_strings() -> None:
    """Nothing close: the message still says how to list formats; non-strings are refused."""
    with pytest.raises(UnknownFormatError, match="lowbit formats"):
        lowbit.format("zzzzzzzz")
    with pytest.raises(UnknownFormatError, match="string"):
        lowbit.format(8)  # type: ignore[arg-type]


# ---- derived properties ------------------------------------------------------------


def _table(fmt: lowbit.Format) -> np.ndarray:
    n = len(fmt.table) if hasattr(fmt, "table") else 1 << fmt.bits
    return fmt.decode(np.arange(n), dtype=np.float64)


@pytest.mark.parametrize("name", sorted(n for n, f in FORMATS.items() if f.bits <= 16))
def test_properties_match_value_table(name: str) -> None:
    """max, min, smallest positive, counts and special flags are those of the decoded table."""
    fmt = FORMATS[name]
    table = _table(fmt)
    finite = table[np.isfinite(table)]
    assert fmt.max == finite.max()
    assert fmt.min == finite.min() + 0.0
    assert fmt.smallest_positive == finite[finite > 0].min()
    assert fmt.finite_count == finite.size
    assert fmt.has_inf == bool(np.isinf(table).any())
    assert fmt.has_nan == bool(np.isnan(table).any())
    np.testing.assert_array_equal(fmt.values(), np.unique(finite + 0.0))
    assert fmt.packed_bits == fmt.bits
    assert fmt.container_bytes * 8 >= fmt.bits
    assert fmt.code_dtype.itemsize == fmt.container_bytes
    assert math.isclose(fmt.digits, -math.log10(fmt.eps / 2)) or math.isnan(fmt.eps)
    assert math.isclose(
        fmt.dynamic_range_binades, math.log2(fmt.max) - math.log2(fmt.smallest_positive)
    )


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_describe_is_json(name: str) -> None:
    """describe() holds every property and survives a JSON round trip."""
    d = FORMATS[name].describe()
    # value sets without a value above 1.0 have no eps: NaN (which the CLI prints as null)
    d = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in d.items()}
    assert json.loads(json.dumps(d, allow_nan=False)) == d
    assert d["name"] == name and d["bits"] == FORMATS[name].bits


@pytest.mark.parametrize(
    ("name", "bits", "container", "packed"),
    [
        ("tensorfloat32", 19, 4, 19),  # not "2 bytes": TF32 lives in a 32-bit container
        ("float8_e4m3fn", 8, 1, 8),
        ("float6_e2m3fn", 6, 1, 6),
        ("float4_e2m1fn", 4, 1, 4),
        ("nf4", 4, 1, 4),
        ("int2", 2, 1, 2),
        ("ternary", 2, 1, 2),
        ("int16", 16, 2, 16),
        ("float64", 64, 8, 64),
    ],
)
def test_storage(name: str, bits: int, container: int, packed: int) -> None:
    """Bits, natural container bytes and packed bits per value."""
    fmt = FORMATS[name]
    assert (fmt.bits, fmt.container_bytes, fmt.packed_bits) == (bits, container, packed)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_ml_dtype_name_without_importing_ml_dtypes(name: str) -> None:
    """``ml_dtype_name`` (what describe() and `lowbit formats` show, read without importing
    ml_dtypes) is the name of ``ml_dtype`` (which imports it) for every catalog format."""
    fmt = FORMATS[name]
    assert fmt.ml_dtype_name == (None if fmt.ml_dtype is None else str(fmt.ml_dtype))


@pytest.mark.parametrize("name", sorted(n for n, f in FORMATS.items() if f.ml_dtype is not None))
def test_properties_match_ml_dtypes(name: str) -> None:
    """Where numpy or ml_dtypes has the type, its finfo/iinfo agrees with lowbit's properties."""
    fmt = FORMATS[name]
    dt = fmt.ml_dtype
    if isinstance(fmt, IntFormat):
        info = ml_dtypes.iinfo(dt)
        assert (info.min, info.max, info.bits) == (fmt.min, fmt.max, fmt.bits)
        return
    info = ml_dtypes.finfo(dt)
    assert float(info.max) == fmt.max
    assert float(info.smallest_normal) == fmt.smallest_normal
    assert float(info.smallest_subnormal) == fmt.smallest_positive
    assert float(info.eps) == fmt.eps
    assert info.bits == fmt.bits


def test_float32_float64_match_numpy() -> None:
    """The two formats too wide to tabulate agree with numpy's finfo."""
    for name, dt in (("float32", np.float32), ("float64", np.float64)):
        fmt, info = FORMATS[name], np.finfo(dt)
        assert fmt.max == float(info.max)
        assert fmt.smallest_normal == float(info.smallest_normal)
        assert fmt.smallest_positive == float(info.smallest_subnormal)
        assert fmt.eps == float(info.eps)
        assert fmt.finite_count == 2 * (2 ** (fmt.bits - 1) - 2**fmt.mbits)


@pytest.mark.torch
def test_torch_dtype_names_exist() -> None:
    """Every torch dtype name lowbit reports is a torch dtype."""
    torch = pytest.importorskip("torch")
    names = [f.torch_dtype_name for f in FORMATS.values() if f.torch_dtype_name]
    assert "float8_e4m3fn" in names and "bfloat16" in names
    for name in names:
        assert isinstance(getattr(torch, name), torch.dtype)


# ---- P3109 ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spelling", "k", "p", "signed", "extended"),
    [
        ("p3109_k8p3se", 8, 3, True, True),
        ("P3109_K8P4UF", 8, 4, False, False),
        ("p3109_k8p3", 8, 3, True, True),
        ("p3109_k6p3sf", 6, 3, True, False),
        ("p3109_k16p11se", 16, 11, True, True),
        ("p3109_k5p5ue", 5, 5, False, True),
    ],
)
def test_p3109_names_parse(spelling: str, k: int, p: int, signed: bool, extended: bool) -> None:
    """Any P3109 name builds the format with that width, precision, signedness and domain,
    the same object as the catalog's where it has one."""
    fmt = lowbit.format(spelling)
    assert fmt == lowbit.p3109(k, p, signed=signed, extended=extended)
    assert (fmt.bits, fmt.mbits + 1, fmt.signed, fmt.has_inf) == (k, p, signed, extended)
    if fmt.name in FORMATS:
        assert fmt is FORMATS[fmt.name] or fmt == FORMATS[fmt.name]


@pytest.mark.parametrize("bad", ["p3109_k8p8se", "p3109_k1p1", "p3109_k8p0", "p3109_k17p3"])
def test_p3109_out_of_range(bad: str) -> None:
    """P3109 widths and precisions outside the family are refused."""
    with pytest.raises(UnknownFormatError):
        lowbit.format(bad)


P3109_CASES = [
    (k, p, s, e)
    for k in (3, 4, 5, 6, 8)
    for s in (True, False)
    for p in range(1, k + (0 if s else 1))
    for e in (True, False)
]


@pytest.mark.parametrize(("k", "p", "signed", "extended"), P3109_CASES)
def test_p3109_matches_gfloat(k: int, p: int, signed: bool, extended: bool) -> None:
    """Every code of every P3109 format of width 3-8 decodes as gfloat's format_info_p3109."""
    fmt = lowbit.p3109(k, p, signed=signed, extended=extended)
    fi = format_info_p3109(
        k,
        p,
        Signedness.Signed if signed else Signedness.Unsigned,
        Domain.Extended if extended else Domain.Finite,
    )
    assert fmt.max == fi.max and fmt.smallest_positive == fi.smallest_subnormal
    assert fmt.has_inf == (fi.num_infs > 0) and fmt.has_negative_zero == fi.has_nz
    mine = fmt.decode(np.arange(1 << k), dtype=np.float64)
    theirs = np.array([decode_float(fi, c).fval for c in range(1 << k)])
    both_nan = np.isnan(mine) & np.isnan(theirs)
    np.testing.assert_array_equal(mine[~both_nan], theirs[~both_nan])
    assert np.isnan(mine).sum() == fi.num_nans


def test_invalid_layout_is_a_lowbit_error() -> None:
    """Building a format from a bad declaration raises LowbitError naming the problems."""
    with pytest.raises(LowbitError, match="ebits=12"):
        FloatFormat(name="x", ebits=12, mbits=3)


# ---- the documentation's table ------------------------------------------------------


def _doc_number(text: str) -> float | None:
    text = text.strip()
    if text.startswith("(") or text == "-":
        return None
    if text.startswith("2^"):
        return 2.0 ** int(text[2:])
    return float(text)


def test_docs_format_table_matches_catalog() -> None:
    """Each row of docs/formats.md's float table states what the catalog derives."""
    from pathlib import Path

    doc = Path(__file__).resolve().parents[2] / "docs" / "formats.md"
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in doc.read_text().splitlines()
        if line.startswith("| ") and line.count("|") == 13
    ]
    rows = [r for r in rows if r[0] in FORMATS]
    assert {r[0] for r in rows} == {n for n, f in FORMATS.items() if isinstance(f, FloatFormat)}
    for name, sem, bias, top, normal, sub, inf, nan, negzero, nbytes, mld, tch in rows:
        fmt = FORMATS[name]
        assert sem == f"{fmt.sign_bits}/{fmt.ebits}/{fmt.mbits}", name
        assert int(bias) == fmt.bias, name
        assert (
            abs(Fraction(top) / Fraction(fmt.max) - 1) < 5e-4
            if "^" not in top
            else (_doc_number(top) == fmt.max)
        ), name
        assert _doc_number(normal) == fmt.smallest_normal, name
        if _doc_number(sub) is not None:
            assert _doc_number(sub) == fmt.smallest_positive, name
        assert (None if inf == "-" else int(inf, 16)) == fmt.inf_code, name
        assert (None if nan == "-" else int(nan, 16)) == fmt.nan_code, name
        assert (negzero == "yes") == fmt.has_negative_zero, name
        assert int(nbytes) == fmt.container_bytes, name
        assert mld == (str(fmt.ml_dtype) if fmt.ml_dtype is not None else "-"), name
        assert tch == (fmt.torch_dtype_name or "-"), name


def test_mx_block_names_explain_themselves() -> None:
    """An MX block name is refused as an element format with a pointer to lowbit.quantize."""
    with pytest.raises(lowbit.UnknownFormatError, match=r"block format.*lowbit\.quantize"):
        lowbit.format("MXFP4")
