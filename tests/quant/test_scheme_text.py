"""The one scheme text form: parse, label, presets, the weight-layout default, errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowbit.errors import LowbitError
from lowbit.quant.scheme import Cast, Granularity, Scheme
from lowbit.quant.scheme_text import PRESETS, REFUSED, format_scheme, parse_scheme

STRINGS = [
    "int8", "int4", "int4:g128", "int4:g128:fp16:asym", "nf4", "nf4:g64:dq", "nf4:dq",
    "fp8_e4m3:ch", "fp8_e4m3:t", "mxfp4", "mxfp6", "mxfp8", "mxint8", "int3:g16:bf16:asym",
    "int8:ch:ax1", "int4:g64:ax0:fp16", "fp4:g16:fp16", "int4:g32:mse", "int8:ch:restricted",
    "ternary", "bf16", "fp16", "fp32", "q4_0", "q8_0", "q5_0",
]  # fmt: skip


@pytest.mark.parametrize("text", STRINGS + list(PRESETS))
def test_label_round_trip(text: str) -> None:
    """Every string's label parses back to an equal scheme, and labels are fixed points."""
    s = parse_scheme(text)
    assert format_scheme(s) == s.label
    again = parse_scheme(s.label)
    assert again == s
    assert again.label == s.label
    assert parse_scheme(s.to_dict()) == s


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_are_their_expanded_schemes(name: str) -> None:
    """A preset is exactly the scheme its fields say (llama.cpp: 32 values per FP16 scale)."""
    s = parse_scheme(name)
    assert s == Scheme(**PRESETS[name])
    assert s.granularity is Granularity.GROUP and s.group_size == 32
    assert s.scale_format == "float16"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("int8", Scheme(format="int8", granularity="channel", axis=0)),
        ("int4", Scheme(format="int4", granularity="channel")),
        ("fp8_e4m3", Scheme(format="fp8_e4m3", granularity="channel")),
        ("int4:fp16", Scheme(format="int4", granularity="channel", scale_format="fp16")),
        ("int4:asym", Scheme(format="int4", granularity="channel", symmetric=False)),
        ("nf4", Scheme(format="nf4", group_size=64)),
        ("nf4:dq", Scheme(format="nf4", group_size=64, double_quant=True)),
        ("mxfp4", Scheme(format="mxfp4")),
        ("int8:t", Scheme(format="int8")),
        ("int8:ax1", Scheme(format="int8", axis=1)),
        ("bf16", Cast("bfloat16")),
        ("fp32", Cast("float32")),
    ],
)
def test_no_granularity_means_the_weight_layout(text: str, expected: object) -> None:
    """A format alone is per output channel (NF4: blocks of 64; MX: 32; bf16/fp16/fp32: casts)."""
    assert parse_scheme(text) == expected


def test_labels_say_everything_the_text_form_can() -> None:
    """Labels: format, granularity, axis when not the default, scale format, options."""
    assert parse_scheme("int8").label == "int8:ch:fp32"
    assert parse_scheme("int4:g128:fp16:asym").label == "int4:g128:fp16:asym"
    assert parse_scheme("nf4:dq").label == "nf4:g64:fp32:dq"
    assert parse_scheme("mxfp8").label == "mxfp8_e4m3"
    assert parse_scheme("q4_0").label == "q4_0"
    assert parse_scheme("int4:g32:fp16:ggml") == parse_scheme("q4_0")
    assert parse_scheme("fp8_e4m3fn:t").label == "fp8_e4m3:t:fp32"
    assert parse_scheme("int4:g32:mse").label == "int4:g32:fp32:mse"
    assert parse_scheme("bf16").label == "bf16"


def test_overrides_apply_on_top_of_the_text() -> None:
    """CLI options: --group replaces ch/t, --axis alone is per channel, --asym, --scale-format."""
    assert parse_scheme("int4", group_size=128) == Scheme(format="int4", group_size=128)
    assert parse_scheme("int4:t", group_size=64) == Scheme(format="int4", group_size=64)
    assert parse_scheme("int8:ch", group_size=32).axis == -1
    assert parse_scheme("int8", axis=1) == Scheme(format="int8", granularity="channel", axis=1)
    assert parse_scheme("int4:g32", symmetric=False, scale_format="fp16") == parse_scheme(
        "int4:g32:fp16:asym"
    )
    assert parse_scheme("bf16", group_size=64) == Scheme(format="bf16", group_size=64)
    assert parse_scheme("int4", group_size=None, axis=None) == parse_scheme("int4")
    s = parse_scheme("int4:g32")
    assert parse_scheme(s) is s
    assert parse_scheme(s, scale_method="mse").label == "int4:g32:fp32:mse"


@pytest.mark.parametrize(
    ("spec", "kw", "fragments"),
    [
        ("int4:g128:banana", {}, ["'int4:g128:banana'", "unknown token 'banana'", "gN"]),
        ("int9:g128", {}, ["'int9:g128'", "unknown format 'int9'"]),
        ("int4:g128:ch", {}, ["'ch' repeats 'g128'"]),
        ("int4::g128", {}, ["empty token"]),
        ("", {}, ["empty format"]),
        (
            "q4_0:asym",
            {},
            ["preset q4_0 takes no options", "llama.cpp's rounding", "int4:g32:fp16"],
        ),
        ("int4:g64:fp16:ggml", {}, ["scale_method 'ggml'", "group_size"]),
        ("nvfp4:g32:g16", {}, ["repeats"]),
        ("q4_1", {}, ["FP16 minimum", "int4:g32:fp16:asym"]),
        ("int4:g16:e4m3", {}, ["scales cannot be stored in float8_e4m3fn", "fp16"]),
        ("fp8_e4m3:asym", {}, ["'fp8_e4m3:asym'", "integer format"]),
        ("fp8_e4m3", {"symmetric": False}, ["'fp8_e4m3'", "integer format"]),
        ("int4:dq", {}, ["NF4 option"]),
        ("mxfp4:g64", {}, ["MX block format"]),
        ("mxfp4", {"group_size": 16}, ["MX"]),
        ("bf16:mse", {}, ["plain cast"]),
        ("fp32:ch", {}, ["too wide"]),
        ("int4", {"colour": "red"}, ["unknown scheme option", "colour"]),
        ({"format": "int4", "colour": 1}, {}, ["unknown field", "colour"]),
        ({"group_size": 32}, {}, ["needs a format"]),
        (42, {}, ["cannot read 42"]),
    ],
)
def test_errors_name_the_bad_part(spec: object, kw: dict, fragments: list[str]) -> None:
    """Every bad scheme is a LowbitError naming the scheme and the part that is wrong."""
    with pytest.raises(LowbitError) as info:
        parse_scheme(spec, **kw)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_refused_names_are_not_presets() -> None:
    """What the quantizer cannot make is refused, never a preset."""
    assert not set(REFUSED) & set(PRESETS)


@settings(max_examples=80, deadline=None)
@given(
    fmt=st.sampled_from(["int2", "int3", "int4", "int8", "uint4", "nf4", "fp4", "fp8_e5m2"]),
    gran=st.sampled_from(["", ":t", ":ch", ":g16", ":g128", ":ch:ax1", ":g32:ax0"]),
    scale=st.sampled_from(["", ":fp16", ":bf16", ":fp32"]),
    asym=st.booleans(),
    method=st.sampled_from(["", ":mse", ":percentile"]),
)
def test_any_valid_string_round_trips(
    fmt: str, gran: str, scale: str, asym: bool, method: str
) -> None:
    """Any string the grammar allows and the quantizer takes round-trips through its label."""
    text = (
        fmt + gran + scale + (":asym" if asym and fmt.startswith(("int", "uint")) else "") + method
    )
    s = parse_scheme(text)
    assert isinstance(s, Scheme)
    assert parse_scheme(s.label) == s
    if gran == "":
        assert s.granularity is (Granularity.GROUP if fmt == "nf4" else Granularity.CHANNEL)
