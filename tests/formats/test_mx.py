"""lowbit.formats.mx: OCP MX v1.0 block formats, checked against gfloat's block functions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowbit import LowbitError
from lowbit.formats.catalog import MX_FORMATS, mx_format
from lowbit.formats.mx import shared_exponent
from lowbit.quant.quantized_tensor import QuantizedTensor
from lowbit.quant.tensor import quantize

gfloat = pytest.importorskip("gfloat")
from gfloat import formats as gf  # noqa: E402
from gfloat.block import compute_scale_amax  # noqa: E402

GFLOAT_BLOCK = {
    "mxfp8_e4m3": gf.format_info_mxfp8_e4m3,
    "mxfp8_e5m2": gf.format_info_mxfp8_e5m2,
    "mxfp6_e3m2": gf.format_info_mxfp6_e3m2,
    "mxfp6_e2m3": gf.format_info_mxfp6_e2m3,
    "mxfp4": gf.format_info_mxfp4_e2m1,
    "mxint8": gf.format_info_mxint8,
}


def _blocks(rng: np.random.Generator, n: int) -> np.ndarray:
    """n blocks of 32 float32 values: normal data at magnitudes 2^-30 .. 2^30, with an
    all-zero block, a block with one outlier and one of exact powers of two."""
    mags = 2.0 ** rng.integers(-30, 30, size=(n, 1))
    x = rng.standard_normal((n, 32)) * mags
    x[0] = 0.0
    x[1, 5] *= 1000.0
    x[2] = 2.0 ** rng.integers(-4, 4, 32) * rng.choice([-1, 1], 32)
    return x.astype(np.float32)


@pytest.mark.parametrize("name", sorted(MX_FORMATS))
def test_mx_agrees_with_gfloat_quantize_block(name: str, rng: np.random.Generator) -> None:
    """Dequantized MX blocks equal gfloat.quantize_block (amax scale rule) block by block."""
    x = _blocks(rng, 60)
    qt = quantize(x, name)
    ours = qt.dequantize(np.float64)
    fi = GFLOAT_BLOCK[name]
    for i in range(x.shape[0]):
        want = gfloat.quantize_block(fi, x[i].astype(np.float64), compute_scale_amax)
        np.testing.assert_array_equal(ours[i], want, err_msg=f"block {i}")


@pytest.mark.parametrize("name", ["mxfp4", "mxfp8_e4m3", "mxint8"])
def test_mx_codes_agree_with_gfloat_encode_block(name: str, rng: np.random.Generator) -> None:
    """E8M0 scale byte and element codes equal gfloat.encode_block's (sign-magnitude floats,
    two's complement ints)."""
    x = _blocks(rng, 20)
    qt = quantize(x, name)
    arrays, _ = qt.to_arrays()
    codes = qt.unpack()
    fi = GFLOAT_BLOCK[name]
    for i in range(x.shape[0]):
        amax = float(np.max(np.abs(x[i])))
        X = compute_scale_amax(fi.etype.emax, np.array([amax]))
        enc = list(gfloat.encode_block(fi, X, x[i].astype(np.float64) / X))
        assert enc[0] == arrays["scale"][i, 0]
        got = codes[i].astype(np.int64) & 0xFF if name == "mxint8" else codes[i]
        np.testing.assert_array_equal(got, enc[1:])


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(sorted(MX_FORMATS)),
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(1, 3),
    cols=st.integers(1, 70),
)
def test_mx_ragged_blocks_match_gfloat(name: str, seed: int, rows: int, cols: int) -> None:
    """A last block shorter than 32 takes its scale from its own values (as gfloat would)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * 2.0 ** rng.integers(-8, 8)).astype(np.float32)
    ours = quantize(x, name).dequantize(np.float64)
    fi = GFLOAT_BLOCK[name]
    for r in range(rows):
        for start in range(0, cols, 32):
            blk = x[r, start : start + 32].astype(np.float64)
            want = gfloat.quantize_block(fi, blk, compute_scale_amax)
            np.testing.assert_array_equal(ours[r, start : start + 32], want)


def test_shared_exponent_rule() -> None:
    """X = 2^(floor(log2 amax) - emax_elem), clamped to [-127, 127]; zero -> -127."""
    amax = np.array([6.0, 7.99, 8.0, 0.0, 2.0**-140, 2.0**200, np.nextafter(np.float32(4), 0)])
    np.testing.assert_array_equal(shared_exponent(amax, 2), [0, 0, 1, -127, -127, 127, -1])


def test_mx_storage_and_bits() -> None:
    """One E8M0 byte per 32 values: 4.25 / 6.25 / 8.25 bits per value; axis=0 blocks."""
    x = np.ones((64, 64), np.float32)
    for name, bits in (
        ("mxfp4", 4.25),
        ("mxfp6_e2m3", 6.25),
        ("mxfp8_e5m2", 8.25),
        ("mxint8", 8.25),
    ):
        qt = quantize(x, name)
        assert qt.bits_per_value == bits
        assert qt.scale.shape == (64, 2)
        arrays, meta = qt.to_arrays()
        assert arrays["scale"].dtype == np.uint8
        back = QuantizedTensor.from_arrays(arrays, meta)
        np.testing.assert_array_equal(back.dequantize(), qt.dequantize())
    qt = quantize(x, "mxfp4", axis=0)
    assert qt.scale.shape == (2, 64)
    assert mx_format("MXFP8").name == "mxfp8_e4m3"


def test_mx_elements_clamp_to_max_normal() -> None:
    """amax just under the next power of two: v/X reaches ~2^(emax+1) and clamps to max."""
    x = np.zeros(32, np.float32)
    x[0] = 7.9  # X = 2^(2-2) = 1 for E2M1, 7.9 -> 6
    x[1] = -7.9
    d = quantize(x, "mxfp4").dequantize()
    assert d[0] == 6.0 and d[1] == -6.0


def test_mx_rejects_other_scales_and_groups() -> None:
    """MX fixes the block (32), the scale (E8M0) and the rule (absmax)."""
    with pytest.raises(LowbitError, match="32"):
        quantize(np.ones(64, np.float32), "mxfp4", group_size=16)
    with pytest.raises(LowbitError, match="E8M0"):
        quantize(np.ones(64, np.float32), "mxfp4", scale_format="fp16")


# OCP MX v1.0 Table 1, emax of each element data type
_SPEC_EMAX = {"mxfp8_e4m3": 8, "mxfp8_e5m2": 15, "mxfp6_e3m2": 4, "mxfp6_e2m3": 2, "mxfp4": 2,
              "mxint8": 0}  # fmt: skip


@pytest.mark.parametrize("name", sorted(MX_FORMATS))
def test_emax_elem_derived_matches_spec_and_gfloat(name: str) -> None:
    """emax_elem (derived from the element format) is OCP MX v1.0 Table 1's and gfloat's."""
    mx = MX_FORMATS[name]
    assert mx.emax_elem == _SPEC_EMAX[name]
    assert mx.emax_elem == GFLOAT_BLOCK[name].etype.emax
    assert mx.scale.name == "float8_e8m0fnu"
    assert mx.bits_per_value == mx.element.bits + 8 / 32
