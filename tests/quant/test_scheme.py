"""lowbit.quant.scheme: derived granularity, validation, bits per value, JSON round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest

import lowbit
from lowbit import LowbitError
from lowbit.quant.scheme import Cast, Granularity, ScaleMethod, Scheme


def test_granularity_is_derived_from_the_options() -> None:
    """group_size -> group, axis -> channel, mx -> block of 32, nf4 -> group 64, else tensor."""
    assert Scheme(format="int8").granularity is Granularity.TENSOR
    assert Scheme(format="int8", axis=0).granularity is Granularity.CHANNEL
    s = Scheme(format="int4", group_size=128)
    assert (s.granularity, s.axis) == (Granularity.GROUP, -1)
    m = Scheme(format="mxfp4")
    assert (m.granularity, m.group_size, m.axis, m.scale_format) == (
        Granularity.BLOCK, 32, -1, "float8_e8m0fnu",
    )  # fmt: skip
    n = Scheme(format="nf4")
    assert (n.granularity, n.group_size) == (Granularity.GROUP, 64)
    assert Scheme(format="nf4", granularity="tensor").granularity is Granularity.TENSOR


def test_names_are_canonical_and_defaults_derived() -> None:
    """Aliases resolve to catalog names; binary/ternary default to the mean-abs scale."""
    assert Scheme(format="fp8_e4m3").format == "float8_e4m3fn"
    assert Scheme(format="int4", scale_format="fp16").scale_format == "float16"
    assert Scheme(format="int4").scale_method is ScaleMethod.ABSMAX
    assert Scheme(format="ternary").scale_method is ScaleMethod.MEANABS
    assert Scheme(format="int4", rounding="sr").rounding == "stochastic"


@pytest.mark.parametrize(
    ("kwargs", "bits"),
    [
        ({"format": "int4", "group_size": 128, "scale_format": "fp16"}, 4.125),
        ({"format": "int4", "group_size": 128}, 4.25),
        (
            {"format": "int4", "group_size": 128, "symmetric": False, "scale_format": "fp16"},
            4.15625,
        ),
        ({"format": "nf4"}, 4.5),
        ({"format": "nf4", "double_quant": True}, 4 + 8 / 64 + 32 / (64 * 256)),
        ({"format": "mxfp4"}, 4.25),
        ({"format": "mxfp6_e3m2"}, 6.25),
        ({"format": "mxint8"}, 8.25),
        ({"format": "int8", "axis": 0}, 8.0),
        ({"format": "fp8_e4m3"}, 8.0),
    ],
)
def test_bits_per_value(kwargs: dict, bits: float) -> None:
    """Element bits + scale (and zero point) bits per group; NF4 double quant = 4.127."""
    assert Scheme(**kwargs).bits_per_value == pytest.approx(bits, abs=1e-12)


def test_to_dict_from_dict_round_trip() -> None:
    """to_dict is JSON-able with a version, and from_dict rebuilds an equal Scheme."""
    for s in (
        Scheme(format="int4", group_size=64, symmetric=False, scale_method="mse"),
        Scheme(format="mxfp8_e5m2", axis=0),
        Scheme(format="nf4", double_quant=True),
        Scheme(format="int8", axis=1, scale_method="percentile", percentile=99.0),
    ):
        d = json.loads(json.dumps(s.to_dict()))
        assert d["version"] == 1
        assert Scheme.from_dict(d) == s
        assert hash(Scheme.from_dict(d)) == hash(s)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"format": "fp8_e4m3", "symmetric": False}, "integer format"),
        ({"format": "int4", "granularity": "block"}, "mx format"),
        ({"format": "mxfp4", "group_size": 64}, "32"),
        ({"format": "mxfp4", "granularity": "group", "group_size": 32}, "block"),
        ({"format": "mxfp4", "scale_method": "mse"}, "absmax"),
        ({"format": "int4", "group_size": 0}, ">= 1"),
        ({"format": "int4", "granularity": "group"}, "group_size"),
        ({"format": "int4", "scale_format": "float8_e4m3fn"}, "scale format"),
        ({"format": "int8", "double_quant": True}, "NF4"),
        ({"format": "float32"}, "too wide"),
        ({"format": "e8m0"}, "cannot be scaled"),
        ({"format": "int4", "scale_method": "median"}, "allowed"),
        ({"format": "int4", "percentile": 0}, "percentile"),
        ({"format": "nope4"}, "unknown format"),
        ({"format": "mxfp5"}, "unknown MX"),
        ({"format": "fp4", "restricted_range": True}, "signed integer"),
    ],
)
def test_bad_schemes_raise(kwargs: dict, match: str) -> None:
    """Each invalid combination is a LowbitError that names the problem."""
    with pytest.raises(LowbitError, match=match):
        Scheme(**kwargs)


def test_from_dict_rejects_unknown_versions_and_keys() -> None:
    """A future version or an unknown key is refused, not silently ignored."""
    with pytest.raises(LowbitError, match="version"):
        Scheme.from_dict({"format": "int8", "version": 2})
    with pytest.raises(LowbitError, match="unknown scheme keys"):
        Scheme.from_dict({"format": "int8", "colour": "red"})


def test_label_is_the_text_form() -> None:
    """label (and describe()) is the one text form: format, granularity, scale format, options."""
    assert Scheme(format="int4", group_size=128, scale_format="fp16").label == "int4:g128:fp16"
    assert Scheme(format="int4", group_size=128, scale_format="fp16").describe() == "int4:g128:fp16"
    assert Scheme(format="mxfp4").label == "mxfp4"
    assert Scheme(format="nf4", double_quant=True).label == "nf4:g64:fp32:dq"
    assert Scheme(format="int8").label == "int8:t:fp32"
    assert Scheme(format="int8", axis=1).label == "int8:ch:ax1:fp32"
    assert Scheme(format="int4", group_size=32, symmetric=False, scale_method="mse").label == (
        "int4:g32:fp32:asym:mse"
    )
    assert Scheme(format="ternary").label == "ternary:t:fp32"  # meanabs is ternary's default


@pytest.mark.parametrize(
    ("kwargs", "shape"),
    [
        ({"format": "int4", "group_size": 128, "scale_format": "fp16"}, (64, 300)),
        ({"format": "int8", "granularity": "channel"}, (7, 5)),
        ({"format": "int8", "granularity": "channel", "axis": 1}, (7, 5, 3)),
        ({"format": "int4", "group_size": 16, "symmetric": False}, (3, 50)),
        ({"format": "int3", "group_size": 7, "axis": 0, "symmetric": False}, (9, 4)),
        ({"format": "nf4", "double_quant": True}, (40, 1000)),
        ({"format": "nf4"}, (5, 3)),
        ({"format": "mxfp4"}, (4, 70)),
        ({"format": "fp8_e4m3"}, (33,)),
        ({"format": "mxint8"}, (2, 64)),
    ],
)
def test_tensor_bytes_is_what_quantize_stores(kwargs: dict, shape: tuple[int, ...]) -> None:
    """Scheme.tensor_bytes (the planner's arithmetic) equals QuantizedTensor.nbytes."""
    scheme = Scheme(**kwargs)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    qt = lowbit.quantize(x, scheme)
    assert scheme.tensor_bytes(shape) == qt.nbytes
    assert scheme.n_scales(shape) == qt.scale.size or scheme.double_quant


def test_scale_bits_derive_from_the_scale_format() -> None:
    """scale_bits is the scale format's width (8 for a double-quantized code)."""
    for fmt, bits in (("fp32", 32), ("fp16", 16), ("bf16", 16)):
        assert Scheme(format="int4", group_size=32, scale_format=fmt).scale_bits == bits
    assert Scheme(format="mxfp4").scale_bits == 8
    assert Scheme(format="nf4", double_quant=True).scale_bits == 8


def test_cast_prices_plain_values() -> None:
    """A Cast stores numel * bits / 8 bytes and only float32/float16/bfloat16."""
    assert Cast("bf16").tensor_bytes((3, 5)) == 30
    assert Cast("fp32").label == "fp32"
    with pytest.raises(LowbitError, match="plain cast"):
        Cast("fp8_e4m3")
