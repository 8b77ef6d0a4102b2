"""q4_0 / q5_0 / q8_0 mean llama.cpp's rounding everywhere (scale method ``ggml``).

Oracle: the ``gguf`` package's numpy quantizer (``gguf.quants.quantize``), which gives the same
bytes as ggml's ``quantize_row_q4_0_ref`` / ``q5_0`` / ``q8_0`` in ggml-quants.c; the golden
blocks below are its output (gguf 0.19.0) written out, so they hold without the package too.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import lowbit
from lowbit.errors import LowbitError
from lowbit.ggml import legacy
from lowbit.quant.quantized_tensor import QuantizedTensor
from lowbit.quant.scheme import Scheme
from lowbit.quant.scheme_text import parse_scheme

# one block: a ramp with its largest magnitude positive (so llama.cpp's Q4_0/Q5_0 scale is
# negative) and a negative outlier at index 7
_BLOCK = np.arange(32, dtype=np.float32) * np.float32(0.37) - np.float32(5.3)
_BLOCK[7] = np.float32(-6.1)
# gguf.quants.quantize(_BLOCK, Q*_0).hex(): float16 scale, then the payload
GOLDEN = {
    "q4_0": "2cba7f7e6e6d5d5c4c4f3b3b2a2a19190808",
    "q5_0": "2cb6ff7f0000eeddcccbbaa9988f766554433221100f",
    "q8_0": "382a939ba2aab1b9c182d0d7dfe7eef6fe050d141c242b333a424a5159616870777f",
}
# what llama.cpp stores, in lowbit's terms: scale, codes (q - 8 for Q4_0)
GOLDEN_Q4_0_CODES = [7, 6, 6, 5, 5, 4, 4, 7, 3, 3, 2, 2, 1, 1, 0, 0,
                     -1, -1, -2, -2, -3, -3, -4, -4, -5, -5, -6, -6, -7, -7, -8, -8]  # fmt: skip
BITS = {"q4_0": 4, "q5_0": 5, "q8_0": 8}


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _values_of_golden(name: str) -> np.ndarray:
    """Dequantize a golden block by the block layouts of ggml-common.h (no gguf package)."""
    raw = np.frombuffer(bytes.fromhex(GOLDEN[name]), np.uint8)
    d = np.float32(raw[:2].view(np.float16)[0])
    if name == "q8_0":
        return d * raw[2:].view(np.int8).astype(np.float32)
    if name == "q4_0":
        q = np.concatenate([raw[2:] & 0x0F, raw[2:] >> 4]).astype(np.float32)
        return d * (q - 8)
    qh = np.unpackbits(raw[2:6], bitorder="little")  # bit j: the 5th bit of element j
    lo = np.concatenate([raw[6:] & 0x0F, raw[6:] >> 4])
    return d * ((lo | (qh << 4)).astype(np.float32) - 16)


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_block(name: str) -> None:
    """lowbit.quantize(x, "q4_0"/"q5_0"/"q8_0") dequantizes to llama.cpp's golden block."""
    qt = lowbit.quantize(_BLOCK, parse_scheme(name))
    np.testing.assert_array_equal(_bits(qt.dequantize()), _bits(_values_of_golden(name)))
    assert qt.scheme.label == name


def test_golden_q4_0_codes_and_bytes() -> None:
    """q4_0's codes and float16 scale rebuild llama.cpp's Q4_0 bytes exactly; lowbit's own
    int4:g32:fp16 rounds the same block differently (so it has its own name)."""
    qt = lowbit.quantize(_BLOCK, "int4", group_size=32, scale_format="float16", scale_method="ggml")
    assert qt.unpack().tolist() == GOLDEN_Q4_0_CODES
    assert legacy.q4_0_from_codes(qt.scale, qt.unpack()).tobytes().hex() == GOLDEN["q4_0"]
    own = lowbit.quantize(_BLOCK, parse_scheme("int4:g32:fp16"))
    assert own.unpack().tolist() != GOLDEN_Q4_0_CODES
    assert own.scheme.label == "int4:g32:fp16"


gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType
QTYPES = {"q4_0": T.Q4_0, "q5_0": T.Q5_0, "q8_0": T.Q8_0}


def _awkward(rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((10, 128)).astype(np.float32)
    x[0, :32] = 0.0
    x[1, :32] = np.float32(-1.0)
    x[2, :32] = np.arange(32) - 15.5  # halves
    x[3, 5], x[3, 9] = 7.0, -7.0  # a tie in magnitude: the first wins
    x[4] *= np.float32(3e4)
    x[5] *= np.float32(1e-6)
    x[6, :32] = np.round(x[6, :32] * 8) / 8
    return x


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_bytes_are_the_oracles(name: str) -> None:
    """The hard-coded golden blocks are what gguf.quants.quantize writes."""
    assert gguf.quants.quantize(_BLOCK, QTYPES[name]).tobytes().hex() == GOLDEN[name]


@pytest.mark.parametrize("name", GOLDEN)
def test_scheme_matches_gguf_quantizer(name: str, rng: np.random.Generator) -> None:
    """The q*_0 schemes dequantize exactly as llama.cpp's blocks on awkward and 3-d input."""
    for x in (_awkward(rng), (rng.standard_normal((3, 5, 64)) * 40).astype(np.float32)):
        ref = gguf.quants.dequantize(gguf.quants.quantize(x, QTYPES[name]), QTYPES[name])
        got = lowbit.quantize(x, parse_scheme(name)).dequantize()
        np.testing.assert_array_equal(_bits(got), _bits(ref.reshape(x.shape)))


@settings(max_examples=60, deadline=None)
@given(
    x=hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 3), st.sampled_from([32, 64])),
        elements=st.floats(-1e4, 1e4, width=32).filter(lambda v: v == 0 or abs(v) >= 1e-30),
    ),
    name=st.sampled_from(list(GOLDEN)),
)
def test_scheme_matches_gguf_property(x: np.ndarray, name: str) -> None:
    """For any finite float32 blocks (hypothesis) the values equal llama.cpp's."""
    ref = gguf.quants.dequantize(gguf.quants.quantize(x, QTYPES[name]), QTYPES[name])
    got = lowbit.quantize(x, parse_scheme(name)).dequantize()
    np.testing.assert_array_equal(_bits(got), _bits(ref.reshape(x.shape)))


def test_round_trips_through_arrays_and_dicts(rng: np.random.Generator) -> None:
    """A q4_0 tensor saves and loads (arrays + scheme dict) to the same values and scheme."""
    x = rng.standard_normal((4, 64)).astype(np.float32)
    qt = lowbit.quantize(x, parse_scheme("q4_0"))
    arrays, meta = qt.to_arrays("w.")
    back = QuantizedTensor.from_arrays(arrays, meta, "w.")
    assert back.scheme == qt.scheme
    assert Scheme.from_dict(qt.scheme.to_dict()) == qt.scheme
    np.testing.assert_array_equal(_bits(back.dequantize()), _bits(qt.dequantize()))


@pytest.mark.parametrize(
    ("kw", "bad"),
    [
        ({"format": "int4", "group_size": 64, "scale_format": "float16"}, "group_size"),
        ({"format": "int4", "group_size": 32}, "scale_format"),
        ({"format": "fp8_e4m3", "group_size": 32, "scale_format": "float16"}, "format"),
        ({"format": "int8", "group_size": 32, "scale_format": "float16", "symmetric": False},
         "symmetric"),
    ],
)  # fmt: skip
def test_ggml_refuses_other_layouts(kw: dict, bad: str) -> None:
    """scale_method='ggml' is only llama.cpp's layouts; anything else names what is wrong."""
    with pytest.raises(LowbitError, match=f"wrong: .*{bad}"):
        Scheme(scale_method="ggml", **kw)


def test_ggml_refuses_ragged_rows() -> None:
    """Rows that are not a multiple of 32 are refused (llama.cpp cannot hold them)."""
    with pytest.raises(LowbitError, match="multiple of 32"):
        lowbit.quantize(np.ones((2, 40), np.float32), parse_scheme("q8_0"))
