"""The explorer CLI (formats, show, decode, values) and lowbit.formats.explain behind it.

Golden values: OCP OFP8 v1.0 (E4M3 max 448 = S.1111.110, NaN = S.1111.111; E5M2 inf =
S.11111.00), OCP MX v1.0 (FP4 E2M1 ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}; E8M0 bias 127, NaN 0xFF),
and the nearest representations of 0.3952 in shared/REFERENCE.md.
"""

from __future__ import annotations

import json
import math

import pytest

from lowbit.cli import build_parser, main
from lowbit.errors import CodeRangeError, LowbitError
from lowbit.formats import explain


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    rc, out, err = run_cli(capsys, *argv, "--json")
    assert rc == 0, err
    return json.loads(out)


def line_of(out: str, name: str) -> str:
    """The table row that starts with a format name."""
    rows = [ln for ln in out.splitlines() if ln.split() and ln.split()[0] == name]
    assert len(rows) == 1, out
    return rows[0]


# ---- help ---------------------------------------------------------------------------


@pytest.mark.parametrize("command", [None, "formats", "show", "decode", "values"])
def test_help_renders_with_examples(
    capsys: pytest.CaptureFixture[str], command: str | None
) -> None:
    """`lowbit --help` and each command's --help print a description and examples."""
    argv = ["--help"] if command is None else [command, "--help"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    if command is None:
        assert all(c in out for c in ("formats", "show", "decode", "values"))
    else:
        assert "examples:" in out and f"lowbit {command}" in out


# ---- formats ------------------------------------------------------------------------


def test_formats_table_has_derived_properties(capsys: pytest.CaptureFixture[str]) -> None:
    """The formats table shows E4M3's 448 / 2^-6 / 2^-9, TF32's 4-byte container, and fits."""
    rc, out, _ = run_cli(capsys, "formats")
    assert rc == 0
    e4m3 = line_of(out, "float8_e4m3fn").split()
    assert e4m3[1:6] == ["8", "1/4/3", "7", "448", "2^-6"]
    assert e4m3[6:8] == ["2^-9", "2^-3"]
    assert "254" in e4m3 and "nan" in e4m3 and "1B/8b" in e4m3
    assert "4B/19b" in line_of(out, "tensorfloat32")
    assert "57344" in line_of(out, "float8_e5m2").split()
    assert "2098.0" in line_of(out, "float64").split()  # log2(max / 2^-1074), not inf
    for name in ("int4", "uint8", "nf4", "ternary", "float8_e8m0fnu", "p3109_k8p3se"):
        line_of(out, name)
    assert max(len(ln) for ln in out.splitlines()) <= 128


def test_formats_kind_filter_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    """--kind keeps one kind; --json carries every describe() property and the aliases."""
    rc, out, _ = run_cli(capsys, "formats", "--kind", "int")
    assert rc == 0 and "int4" in out and "float16" not in out and "nf4" not in out
    data = run_json(capsys, "formats")
    by_name = {d["name"]: d for d in data}
    e4m3 = by_name["float8_e4m3fn"]
    assert e4m3["max"] == 448.0 and e4m3["smallest_positive"] == 2.0**-9
    assert e4m3["has_inf"] is False and e4m3["has_nan"] is True
    assert "e4m3" in e4m3["aliases"] and "fp8" in e4m3["aliases"]
    assert by_name["tensorfloat32"]["container_bytes"] == 4
    assert by_name["float64"]["dynamic_range_binades"] == pytest.approx(2098.0, abs=0.01)
    assert by_name["nf4"]["kind"] == "valueset"


# ---- show ---------------------------------------------------------------------------


def test_show_default_matches_reference_values(capsys: pytest.CaptureFixture[str]) -> None:
    """`lowbit show 0.3952` gives e4m3fn 0.40625 = 0 0101 101 and the REFERENCE values."""
    rc, out, _ = run_cli(capsys, "show", "0.3952")
    assert rc == 0
    assert "0.39519999999999999573674358543939888477325439453125" in out
    assert "0x1.94af4f0d844d0p-2" in out
    e4m3 = line_of(out, "float8_e4m3fn")
    assert "0.40625" in e4m3 and "0 0101 101" in e4m3 and "0x2d" in e4m3
    assert "rounded up" in e4m3
    expected = {
        "bfloat16": "0.39453125",
        "float16": "0.395263671875",
        "float8_e5m2": "0.375",
        "float6_e2m3fn": "0.375",
        "float6_e3m2fn": "0.375",
        "float4_e2m1fn": "0.5",
    }
    for name, value in expected.items():
        assert value in line_of(out, name).split(), name
    assert "subnormal" in line_of(out, "float4_e2m1fn")
    assert "No scale applied" in out and "nf4" in out


def test_show_json_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    """--json gives the value, code, fields and exact errors for each format."""
    data = run_json(capsys, "show", "0.3952", "--formats", "e4m3,bf16")
    assert data["float64"] == 0.3952
    r = {d["format"]: d for d in data["results"]}
    e4m3 = r["float8_e4m3fn"]
    assert e4m3["value"] == 0.40625 and e4m3["code"] == 0x2D and e4m3["hex"] == "0x2d"
    assert e4m3["fields"] == {"sign": "0", "exponent": "0101", "mantissa": "101"}
    assert e4m3["abs_error"] == pytest.approx(0.40625 - 0.3952, rel=1e-12)
    assert e4m3["rel_error"] == pytest.approx((0.40625 - 0.3952) / 0.3952, rel=1e-12)
    assert e4m3["status"] == "rounded"
    assert r["bfloat16"]["value"] == 0.39453125 and r["bfloat16"]["code"] == 0x3ECA


@pytest.mark.parametrize(
    ("value", "fmt", "extra", "status", "shown"),
    [
        ("465", "e4m3", [], "overflow", "nan"),
        ("465", "e4m3", ["--saturate"], "saturated", 448.0),
        ("464", "e4m3", [], "rounded", 448.0),  # the tie goes to even 448, not to NaN
        ("1e6", "e5m2", [], "overflow", "inf"),
        ("100", "fp4", [], "saturated", 6.0),  # no inf, no NaN: clamps by spec
        ("7", "fp4", [], "saturated", 6.0),  # tie 6|8 goes to the even 8, beyond max
        ("inf", "e5m2", [], "inf", "inf"),
        ("-inf", "e4m3", [], "overflow", "nan"),
        ("nan", "e4m3", [], "nan", "nan"),
        ("nan", "fp4", [], "unrepresentable", None),
        ("1e-5", "e4m3", [], "underflow", 0.0),
        ("-3", "e8m0", [], "invalid", "nan"),
        ("0x1p-9", "e4m3", [], "exact", 2.0**-9),
        ("300", "int8", [], "saturated", 127.0),
        ("2.5", "int8", [], "rounded", 2.0),
        ("0.3", "int8", ["--rounding", "toward_positive"], "rounded", 1.0),
    ],
)
def test_show_status(
    capsys: pytest.CaptureFixture[str],
    value: str,
    fmt: str,
    extra: list[str],
    status: str,
    shown: object,
) -> None:
    """Each kind of outcome is named: exact, rounded, underflow, overflow, saturated, ..."""
    data = run_json(capsys, "show", value, "--formats", fmt, *extra)
    (r,) = data["results"]
    assert r["status"] == status
    assert r["value"] == shown


def test_show_negative_zero_and_subnormal(capsys: pytest.CaptureFixture[str]) -> None:
    """-0 keeps its sign in e4m3fn, becomes +0 in fnuz; 2^-9 is an exact e4m3 subnormal."""
    data = run_json(capsys, "show", "-0", "--formats", "e4m3,e4m3fnuz")
    r = {d["format"]: d for d in data["results"]}
    assert r["float8_e4m3fn"]["hex"] == "0x80"
    assert (
        r["float8_e4m3fnuz"]["hex"] == "0x00"
        and "no negative zero" in (r["float8_e4m3fnuz"]["what"])
    )
    (sub,) = run_json(capsys, "show", "0x1p-9", "--formats", "e4m3")["results"]
    assert sub["subnormal"] is True and sub["bits"] == "0 0000 001"


def test_show_negative_values_as_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    """-inf, -0x1.8p-3 and -1e-3 are read as VALUE, not as options."""
    for text, x in (("-inf", -math.inf), ("-0x1.8p-3", -0.1875), ("-1e-3", -0.001)):
        rc, out, err = run_cli(capsys, "show", text, "--formats", "bf16", "--json")
        assert rc == 0, err
        assert json.loads(out)["float64"] == (x if math.isfinite(x) else "-inf")


def test_show_all_formats(capsys: pytest.CaptureFixture[str]) -> None:
    """--formats all converts into every catalog format without an error."""
    from lowbit.formats.catalog import FORMATS

    data = run_json(capsys, "show", "1.1", "--formats", "all")
    assert [r["format"] for r in data["results"]] == list(FORMATS)


# ---- decode -------------------------------------------------------------------------


def test_decode_e4m3_max_and_nan(capsys: pytest.CaptureFixture[str]) -> None:
    """0x7e in e4m3fn is 448 = 2^(15-7) × 1.110b; 0x7f is NaN (no infinities)."""
    rc, out, _ = run_cli(capsys, "decode", "e4m3", "0x7e")
    assert rc == 0
    assert "value    448" in out and "class    normal" in out
    assert "(-1)^0 × 2^(15-7) × 1.110b = 2^8 × 1.75 = 448" in out
    assert "0 1111 110" in out
    rc, out, _ = run_cli(capsys, "decode", "float8_e4m3fn", "0b01111111")
    assert rc == 0 and "class    NaN" in out


@pytest.mark.parametrize(
    ("fmt", "code", "cls", "value"),
    [
        ("e5m2", "0b01111100", "inf", "inf"),
        ("e5m2", "0xfc", "inf", "-inf"),
        ("e4m3fnuz", "0x80", "NaN", "nan"),
        ("e4m3", "1", "subnormal", 2.0**-9),
        ("e4m3", "0x80", "zero", -0.0),
        ("fp4", "0b0111", "normal", 6.0),
        ("fp4", "0110", "normal", 4.0),  # bare 0/1 string with a leading zero: binary
        ("e8m0", "127", "normal", 1.0),
        ("e8m0", "0xff", "NaN", "nan"),
        ("int8", "0xfe", "integer", -2.0),
        ("uint8", "0xfe", "integer", 254.0),
        ("nf4", "0", "table entry", -1.0),
        ("bf16", "0x3f80", "normal", 1.0),
    ],
)
def test_decode_classes(
    capsys: pytest.CaptureFixture[str], fmt: str, code: str, cls: str, value: object
) -> None:
    """decode --json names the class and value of special, subnormal and ordinary codes."""
    d = run_json(capsys, "decode", fmt, code)
    assert d["class"] == cls
    assert d["value"] == value
    if isinstance(value, float) and value == 0:
        assert math.copysign(1, d["value"]) == -1


@pytest.mark.parametrize(
    ("fmt", "code", "message"),
    [
        ("e4m3", "0x100", "out of range"),
        ("fp4", "16", "out of range"),
        ("ternary", "3", "out of range"),
        ("e4m3", "-1", "negative"),
        ("e4m3", "0xzz", "cannot read code"),
        ("e4mm3", "0x7e", "did you mean"),
    ],
)
def test_decode_bad_input_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], fmt: str, code: str, message: str
) -> None:
    """A bad code or format name: exit 2, one stderr line, no traceback."""
    rc, out, err = run_cli(capsys, "decode", fmt, code)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err
    assert "Traceback" not in err


# ---- values -------------------------------------------------------------------------


def test_values_fp4(capsys: pytest.CaptureFixture[str]) -> None:
    """values fp4 lists the 16 codes (15 distinct values) ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}."""
    rc, out, _ = run_cli(capsys, "values", "fp4")
    assert rc == 0
    assert "16 codes, 16 finite, 15 distinct values (+0 and -0)" in out
    data = run_json(capsys, "values", "fp4")
    vals = [d["value"] for d in data["values"]]
    mags = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert vals == [-m for m in reversed(mags)] + mags
    assert math.copysign(1, vals[7]) == -1 and data["values"][7]["hex"] == "0x8"
    assert data["distinct_values"] == 15 and data["non_finite"] == []


def test_values_e4m3_and_e5m2_specials(capsys: pytest.CaptureFixture[str]) -> None:
    """e4m3fn has 254 finite codes up to 448 and NaN codes 0x7f, 0xff; e5m2 lists its infs."""
    data = run_json(capsys, "values", "e4m3")
    assert data["finite_count"] == 254 and data["values"][-1]["value"] == 448.0
    assert [d["hex"] for d in data["non_finite"]] == ["0x7f", "0xff"]
    rc, out, _ = run_cli(capsys, "values", "e5m2")
    assert rc == 0 and "+inf: 0x7c" in out and "-inf: 0xfc" in out
    assert "NaN: 0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff" in out


def test_values_refuses_wide_formats(capsys: pytest.CaptureFixture[str]) -> None:
    """values float16 exits 2 with one line saying the 8-bit limit."""
    rc, out, err = run_cli(capsys, "values", "fp16")
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "at most 8 bits" in err


def test_unknown_format_lists_close_matches(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown format name in any command: exit 2, one line with close matches."""
    for argv in (["values", "fp44"], ["show", "1", "--formats", "bf61"]):
        rc, out, err = run_cli(capsys, *argv)
        assert rc == 2 and out == ""
        assert len(err.strip().splitlines()) == 1 and "did you mean" in err


def test_show_bad_value_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """A VALUE that is not a number or a bad rounding mode: exit 2, one line."""
    for argv in (["show", "abc"], ["show", "1", "--rounding", "sideways"]):
        rc, out, err = run_cli(capsys, *argv)
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1


# ---- lowbit.formats.explain -----------------------------------------------------------------


def test_parse_value_forms() -> None:
    """parse_value reads decimals, hex floats, fractions, inf, nan and -0."""
    assert explain.parse_value("0x1.8p-3") == 0.1875
    assert explain.parse_value("1/3") == 1 / 3
    assert math.copysign(1, explain.parse_value("-0")) == -1
    assert math.isnan(explain.parse_value("nan"))
    assert explain.parse_value("-inf") == -math.inf
    with pytest.raises(LowbitError, match="cannot read"):
        explain.parse_value("zero point four")


def test_parse_code_forms() -> None:
    """parse_code reads hex, binary, decimal, underscores; rejects negatives and junk."""
    assert explain.parse_code("0x7e") == 126
    assert explain.parse_code("0b0_1111_110") == 126
    assert explain.parse_code("126") == 126
    assert explain.parse_code("0110") == 6
    with pytest.raises(CodeRangeError):
        explain.parse_code("-3")
    with pytest.raises(LowbitError):
        explain.parse_code("seven")


def test_exact_decimal_is_exact() -> None:
    """exact_decimal gives the full expansion; short_decimal marks inexact reprs with ≈."""
    assert explain.exact_decimal(0.1) == "0.1000000000000000055511151231257827021181583404541015625"
    assert explain.exact_decimal(448.0) == "448" and explain.exact_decimal(-0.0) == "-0"
    assert explain.short_decimal(0.40625) == "0.40625"
    assert explain.short_decimal(2.0**-127).startswith("≈")


def test_convert_agrees_with_round_on_every_e4m3_midpoint() -> None:
    """convert's value equals Format.round at every midpoint and code of e4m3fn."""
    from lowbit import format as get_format

    f = get_format("e4m3")
    vals = f.values()
    points = list(vals) + list((vals[1:] + vals[:-1]) / 2)
    for x in points[::3]:
        r = explain.convert(float(x), f)
        assert r["value"] == float(f.round(float(x))), x
        assert r["status"] in ("exact", "rounded", "underflow")


def test_building_parser_is_light() -> None:
    """The parser builds with the explorer commands registered."""
    parser = build_parser()
    args = parser.parse_args(["decode", "e4m3", "0x7e"])
    assert args.command == "decode" and args.code == "0x7e"


def test_convert_every_catalog_format_on_special_values() -> None:
    """convert never fails on specials and edges; 'exact' means value == input."""
    from lowbit.formats.catalog import FORMATS

    texts = ["0", "-0", "1", "-2.5", "0.3952", "1e-40", "-1e40", "inf", "-inf", "nan", "5e-324"]
    for f in FORMATS.values():
        for text in texts:
            x = explain.parse_value(text)
            for saturate in (False, True):
                r = explain.convert(text, f, saturate=saturate)
                if r["status"] == "exact":
                    assert r["value"] == x, (f.name, text)
                if r["status"] == "unrepresentable":
                    assert math.isnan(x) and not f.has_nan
                if saturate and r["value"] is not None and not math.isnan(x):
                    assert not math.isnan(r["value"]) or x < 0, (f.name, text)


def test_toward_zero_overflow_is_saturated() -> None:
    """IEEE 754 §7.4: rounding toward zero never overflows to inf; it is labelled saturated."""
    r = explain.convert(1e6, "e5m2", rounding="toward_zero")
    assert r["value"] == 57344.0 and r["status"] == "saturated"
    r = explain.convert(1e6, "e5m2", rounding="toward_positive")
    assert r["value"] == math.inf and r["status"] == "overflow"
