"""NVFP4 and the MX scale rules: a plain reference from the definitions, and compressed-tensors'
own quantizer (``calculate_qparams``, ``generate_gparam``, the NVFP4/MXFP4 compressors)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import lowbit
from lowbit.errors import LowbitError
from lowbit.quant.quantized_tensor import QuantizedTensor
from lowbit.quant.scheme_text import parse_scheme

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _e2m1_code(t: float) -> int:
    """Nearest E2M1 magnitude (ties to the even code), saturating; sign bit unless t == 0."""
    if t == 0:
        return 0
    a = min(abs(t), 6.0)
    best = min(range(8), key=lambda i: (abs(a - E2M1[i]), i % 2))
    return best | (8 if t < 0 else 0)


def _e4m3(v: np.float32) -> np.float32:
    return np.float32(np.float32(v).astype(ml_dtypes.float8_e4m3fn).astype(np.float32))


def reference_nvfp4(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """(codes [out, in], E4M3 group scales [out, in/16], tensor scale) from NVFP4's definition
    as compressed-tensors computes it, one value at a time in float32."""
    f32 = np.float32
    amax = f32(np.max(np.abs(x)))
    g = f32(1.0) if amax == 0 else f32(f32(f32(1.0) / amax) * f32(448.0 * 6.0))  # torch: 1/a * c
    out, cols = x.shape
    codes = np.zeros(x.shape, dtype=np.uint8)
    scales = np.zeros((out, cols // 16), dtype=np.float32)
    for r in range(out):
        for b in range(cols // 16):
            blk = x[r, b * 16 : (b + 1) * 16]
            s = _e4m3(min(f32(f32(np.max(np.abs(blk))) / f32(6.0)) * g, f32(448.0)))
            s = f32(0.125) if s == 0 else s
            scales[r, b] = s
            eff = f32(s / g)
            for j, v in enumerate(blk):
                codes[r, b * 16 + j] = _e2m1_code(float(f32(v) / eff))
    return codes, scales, g


def _nibbles(qt: QuantizedTensor) -> np.ndarray:
    return qt.unpack().astype(np.uint8)


def _cases() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    ties = np.tile(np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], np.float32), 4)
    ties = np.concatenate([ties, -ties]).reshape(2, 32)  # amax 6: g*1/6*... ties stay ties
    zero_rows = rng.standard_normal((4, 64)).astype(np.float32)
    zero_rows[1] = 0.0
    zero_rows[2, :16] = -0.0
    zero_rows[3, 16:32] = 1e-30  # underflows its E4M3 scale
    extreme = (rng.standard_normal((4, 64)) * np.logspace(-20, 20, 64)).astype(np.float32)
    return {
        "normal": rng.standard_normal((8, 128)).astype(np.float32),
        "ties": ties,
        "zeros_and_negzero": zero_rows,
        "extreme": extreme,
        "heavy_tail": rng.standard_t(2, (16, 64)).astype(np.float32),
    }


@pytest.mark.parametrize("path", ["numpy", "kernels"])
@pytest.mark.parametrize("case", list(_cases()))
def test_nvfp4_equals_the_reference(case: str, path: str) -> None:
    """Codes, E4M3 group scales and the tensor scale equal the definition's, value by value,
    on the numpy path and the one-pass compiled kernel (``_numba.nvfp4_encode``)."""
    from lowbit.codecs import _numba

    if path == "kernels":
        pytest.importorskip("numba")
    x = _cases()[case]
    with _numba.numpy_only() if path == "numpy" else _numba.kernels_always():
        qt = lowbit.quantize(x, parse_scheme("nvfp4"), underflow="ignore")
    codes, scales, g = reference_nvfp4(x)
    assert qt.tensor_scale == g
    np.testing.assert_array_equal(qt.group_scale, scales)
    np.testing.assert_array_equal(_nibbles(qt), codes)
    deq = codes_values(codes) * np.repeat((scales / g).astype(np.float32), 16, axis=1)
    np.testing.assert_array_equal(qt.dequantize(), deq.astype(np.float32))


def codes_values(codes: np.ndarray) -> np.ndarray:
    mag = np.array(E2M1, np.float32)[codes & 7]
    return np.where(codes & 8, -mag, mag).astype(np.float32)


def test_nvfp4_scales_are_legal_e4m3_and_round_trip() -> None:
    """Every stored scale is a finite positive E4M3 value; to_arrays/from_arrays is exact and
    says the tensor scale's direction."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((32, 256)) * np.logspace(-6, 6, 256)).astype(np.float32)
    qt = lowbit.quantize(x, parse_scheme("nvfp4"), underflow="ignore")
    s = qt.group_scale
    assert np.all(s > 0) and np.all(s <= 448) and np.isfinite(s).all()
    assert np.array_equal(s.astype(ml_dtypes.float8_e4m3fn).astype(np.float32), s)
    arrays, meta = qt.to_arrays("w.")
    assert arrays["w.scale"].dtype == np.uint8 and arrays["w.tensor_scale"].dtype == np.float32
    assert meta["tensor_scale"] == "value = code * scale / tensor_scale"
    back = QuantizedTensor.from_arrays(arrays, meta, "w.")
    assert np.array_equal(back.dequantize(), qt.dequantize())
    assert back.nbytes == qt.nbytes == qt.scheme.tensor_bytes(x.shape)
    meta_bad = dict(meta, tensor_scale="value = code * scale * tensor_scale")
    with pytest.raises(LowbitError, match="direction"):
        QuantizedTensor.from_arrays(arrays, meta_bad, "w.")


def test_nvfp4_bad_input() -> None:
    """Non-finite input, a tensor too small for its tensor scale, and E4M3 scales without a
    tensor scale are one LowbitError each."""
    s = parse_scheme("nvfp4")
    with pytest.raises(LowbitError, match="NaN"):
        lowbit.quantize(np.array([[1.0, np.nan] * 8], np.float32), s)
    with pytest.raises(LowbitError, match="too small for a float32 tensor scale"):
        lowbit.quantize(np.full((1, 16), 1e-38, np.float32), s)
    with pytest.raises(LowbitError, match="without a float32 tensor scale"):
        parse_scheme("fp4:g16:e4m3")
    with pytest.raises(LowbitError, match="tensor_scale is NVFP4"):
        parse_scheme("int4:g16:e4m3:ts")
    z = lowbit.quantize(np.zeros((2, 32), np.float32), s)
    assert z.tensor_scale == 1.0 and np.all(z.group_scale == 0.125)


def test_nvfp4_text_forms() -> None:
    """nvfp4 is fp4:g16:e4m3:ts, labelled nvfp4, 4.5 bits per value plus 4 bytes a tensor."""
    s = parse_scheme("nvfp4")
    assert s == parse_scheme("fp4:g16:e4m3:ts") and s.label == "nvfp4"
    assert parse_scheme(s.label) == s and parse_scheme(s.to_dict()) == s
    assert s.bits_per_value == 4.5 and s.tensor_bytes((4, 64)) == 128 + 16 + 4
    assert parse_scheme("fp4:g32:e4m3:ts").label == "fp4:g32:fp8_e4m3:ts"


# ---- MX scale rules -----------------------------------------------------------------


def _mx_exp_reference(amax: float, fmt: str, rule: str) -> int:
    """The E8M0 exponent from the rule's words (lowbit.quant.scheme.MX_SCALE_RULES)."""
    top, emax, mbits = {
        "mxfp4": (6.0, 2, 1), "mxfp6_e2m3": (7.5, 2, 3), "mxfp8_e4m3": (448.0, 8, 3),
        "mxfp6_e3m2": (28.0, 4, 2), "mxfp8_e5m2": (57344.0, 15, 2),
    }[fmt]  # fmt: skip
    if amax == 0:
        return -127
    e = math.frexp(amax)[1] - 1 - emax
    r = amax / 2.0**e
    if rule == "ceil":
        e += r > top
    elif rule == "carry":
        ulp = 2.0 ** (emax - mbits)
        q = round(r / ulp) * ulp  # Python rounds half to even
        e += q > top
    elif rule == "ct":
        m = 3 if fmt == "mxfp6_e2m3" else 1
        e += r / 2.0**emax >= 2 - 2.0 ** -(m + 1)
    return max(-127, min(127, e))


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp6_e2m3", "mxfp8_e4m3", "mxfp6_e3m2", "mxfp8_e5m2"])
@pytest.mark.parametrize("rule", ["floor", "carry", "ceil", "ct"])
def test_mx_rules_equal_their_definition(fmt: str, rule: str) -> None:
    """Each block's E8M0 exponent is what the rule's definition gives, including the
    significands where rules part (1.75, 7/6 of the max, ties) and all-zero blocks."""
    if rule == "ct" and fmt in ("mxfp6_e3m2", "mxfp8_e5m2"):
        with pytest.raises(LowbitError, match="compressed-tensors' scale rule"):
            parse_scheme(f"{fmt}:{rule}")
        return
    sigs = [1.0, 1.5, 1.625, 1.74, 1.75, 1.8125, 1.875, 1.90625, 1.9375, 1.96875, 1.999]
    amaxes = [s * 2.0**k for s in sigs for k in (-3, 0, 5)] + [0.0]
    x = np.zeros((len(amaxes), 32), np.float32)
    x[:, 0] = amaxes
    x[:, 1] = -np.array(amaxes, np.float32) / 3
    qt = lowbit.quantize(x, parse_scheme(f"{fmt}:{rule}"), underflow="ignore")
    got = np.frexp(qt.scale.reshape(-1).astype(np.float64))[1] - 1
    want = [_mx_exp_reference(float(np.float32(a)), fmt, rule) for a in amaxes]
    assert list(got) == want


def test_mx_rule_labels() -> None:
    """floor stays the default and unlabelled; the others round-trip through the text form."""
    assert parse_scheme("mxfp4").scale_rule == "floor" and parse_scheme("mxfp4").label == "mxfp4"
    for r in ("carry", "ceil", "ct"):
        s = parse_scheme(f"mxfp4:{r}")
        assert s.label == f"mxfp4:{r}" and parse_scheme(s.to_dict()) == s
    with pytest.raises(LowbitError, match="not an MX format"):
        parse_scheme("int4:g32:ct")
