"""lowbit.ggml.blocks: llama.cpp's own bytes for every block type, decoding as gguf does, bounds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lowbit.errors import LowbitError
from lowbit.ggml import blocks, iq1, iq_lattice
from lowbit.ggml._search import seqsum

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp" / "blocks"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
assert {o["type"] for o in MANIFEST["outputs"]} == set(blocks.TYPES)
# the i-quants' fixtures are tests/ggml/test_iq_lattice.py's (slower searches)
LATTICE = set(iq_lattice.BLOCK_BYTES) | set(iq1.BLOCK_BYTES)
OUTPUTS = [o for o in MANIFEST["outputs"] if o["type"] not in LATTICE]


def _input(name: str) -> np.ndarray:
    return np.load(FIXTURES / MANIFEST["inputs"][name]["file"]).astype(np.float32)


def _imatrix(name: str) -> np.ndarray:
    return np.load(FIXTURES / MANIFEST["inputs"][name]["imatrix"]).astype(np.float32)


@pytest.mark.parametrize(
    "out",
    OUTPUTS,
    ids=[f"{o['input']}-{o['type']}-{'imatrix' if o['imatrix'] else 'plain'}" for o in OUTPUTS],
)
def test_quantize_equals_llamacpp_bytes(out: dict) -> None:
    """quantize gives exactly the bytes llama.cpp's ggml_quantize_chunk wrote."""
    x = _input(out["input"])
    im = _imatrix(out["input"]) if out["imatrix"] else None
    got = blocks.quantize(x, out["type"], imatrix=im)
    want = (FIXTURES / out["file"]).read_bytes()
    assert blocks.TYPES[out["type"]].number == out["ggml_type"]
    assert got.shape == (x.shape[0], len(want) // x.shape[0])
    assert got.tobytes() == want


def test_every_type_has_fixtures() -> None:
    """The fixtures cover every type of the table (and nothing else), with and without imatrix."""
    seen = {(o["type"], o["imatrix"]) for o in MANIFEST["outputs"]}
    for t in blocks.TYPES.values():
        assert ((t.name, False) in seen) == (t.name not in blocks.NEEDS_IMATRIX)
        assert ((t.name, True) in seen) == t.uses_imatrix


@pytest.mark.parametrize("qtype", sorted(blocks.TYPES))
def test_dequantize_equals_gguf(qtype: str) -> None:
    """dequantize decodes llama.cpp's bytes bit for bit as the gguf package does."""
    gguf = pytest.importorskip("gguf")
    for out in MANIFEST["outputs"]:
        if out["type"] != qtype:
            continue
        raw = np.frombuffer((FIXTURES / out["file"]).read_bytes(), dtype=np.uint8)
        raw = raw.reshape(_input(out["input"]).shape[0], -1)
        ours = blocks.dequantize(raw, qtype)
        theirs = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype])
        assert ours.shape == theirs.shape
        np.testing.assert_array_equal(
            ours.view(np.uint32), theirs.astype(np.float32).view(np.uint32)
        )


# Largest |x - decode(encode(x))| over a block, in units of the block's largest |x|: about
# 1.5x the worst seen over 60 seeds of these inputs (the searches may trade a block's extreme
# value for the rest; ternary and MXFP4 are at most half a step of their coarsest level).
_BOUND = {
    "Q8_0": 0.0066, "Q6_K": 0.066, "Q5_0": 0.12, "Q5_1": 0.093, "Q5_K": 0.1, "Q4_0": 0.31,
    "Q4_1": 0.29, "Q4_K": 0.19, "IQ4_NL": 0.29, "IQ4_XS": 0.32, "Q3_K": 0.44, "Q2_K": 0.86,
    "MXFP4": 0.2501, "NVFP4": 0.26, "TQ1_0": 0.5005, "TQ2_0": 0.5005,
    # the lattice i-quants, over super-blocks of 256 (worst of 40 seeds: 0.94, 0.89, 0.69,
    # 0.77, 0.40; IQ1_S 1.27, IQ1_M 1.15 over 30): a 1- or 2-bit grid may round a block's
    # largest value far down
    "IQ2_XXS": 1.2, "IQ2_XS": 1.2, "IQ2_S": 1.0, "IQ3_XXS": 1.0, "IQ3_S": 0.6, "IQ1_S": 1.9,
    "IQ1_M": 1.75,
}  # fmt: skip
# The ternary types round x / amax to a trit but store amax as float16 (relative error up to
# 2^-11): a value just above amax / 2 decodes to float16(amax), off by up to (1/2 + 2^-11) amax.
# Hypothesis found 0.50027 (TQ1_0, seed 2^32 - 1, scale 22.57, tail 100) against 0.5002 here.


@settings(max_examples=40, deadline=None)
@example(qtype="TQ1_0", seed=2**32 - 1, scale=22.5703125, tail=100.0, use_imatrix=False)
@given(
    qtype=st.sampled_from(sorted(blocks.TYPES)),
    seed=st.integers(0, 2**32 - 1),
    scale=st.floats(1e-2, 1e2),
    tail=st.sampled_from([2.0, 5.0, 100.0]),
    use_imatrix=st.booleans(),
)
def test_roundtrip_error_bound(
    qtype: str, seed: int, scale: float, tail: float, use_imatrix: bool
) -> None:
    """decode(encode(x)) stays within a per-type fraction of each block's largest |x|."""
    t = blocks.TYPES[qtype]
    if qtype == "NVFP4":  # no tensor scale: blocks below ~0.01 fall into UE4M3's subnormals
        scale = max(scale, 1.0)
    rng = np.random.default_rng(seed)
    x = (rng.standard_t(tail, size=(3, 512)) * scale).astype(np.float32)
    use_imatrix = use_imatrix or qtype in blocks.NEEDS_IMATRIX
    im = rng.uniform(0.01, 10, size=512).astype(np.float32) if use_imatrix else None
    y = blocks.dequantize(blocks.quantize(x, qtype, imatrix=im), qtype)
    assert y.shape == x.shape and np.isfinite(y).all()
    err = np.abs(y - x).reshape(-1, t.block).max(axis=1)
    amax = np.abs(x).reshape(-1, t.block).max(axis=1)
    # NVFP4 has no tensor scale: a block past E2M1's 6 x E4M3's 448 saturates at 2688
    clip = np.maximum(amax - 2688.0, 0) if qtype == "NVFP4" else 0.0
    assert (err <= _BOUND[qtype] * amax + clip + 1e-6 * scale).all()


@pytest.mark.parametrize("qtype", sorted(blocks.TYPES))
def test_zero_rows_stay_zero(qtype: str) -> None:
    """An all-zero tensor decodes to zeros."""
    x = np.zeros((2, 512), dtype=np.float32)
    y = blocks.dequantize(blocks.quantize(x, qtype, imatrix=np.ones(512)), qtype)
    assert not y.any()


def test_seqsum_is_in_order() -> None:
    """seqsum adds from the first element on, as C's += loop (not numpy's pairwise sum)."""
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((256, 50)) * np.exp2(rng.integers(-20, 20, (256, 50)))).astype(
        np.float32
    )
    want = a[0].copy()
    for row in a[1:]:
        want = (want + row).astype(np.float32)
    np.testing.assert_array_equal(seqsum(a), want)


def test_sizes_and_lookup() -> None:
    """row_bytes/nbytes follow the block table; names, numbers and gguf enums all look up."""
    assert blocks.row_bytes("q4_k", 512) == 288
    assert blocks.nbytes((3, 1024), "Q6_K") == 3 * 4 * 210
    assert blocks.ggml_type(12).name == "Q4_K"
    gguf = pytest.importorskip("gguf")
    for t in blocks.TYPES.values():
        assert blocks.ggml_type(gguf.GGMLQuantizationType[t.name]) is t
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t.name]] == (t.block, t.size)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: blocks.quantize(np.ones((2, 576)), "Q4_K"), "blocks of 256"),
        (lambda: blocks.quantize(np.ones((2, 256)), "Q9_K"), "unknown GGML block type"),
        (lambda: blocks.quantize(np.array([[np.nan] * 32]), "Q4_0"), "NaN"),
        (lambda: blocks.quantize(np.ones((1, 256)), "Q4_K", imatrix=np.ones(255)), "255 values"),
        (lambda: blocks.quantize(np.ones((1, 256)), "Q4_K", imatrix=-np.ones(256)), "non-negative"),
        (lambda: blocks.quantize(np.array(["a"] * 32), "Q8_0"), "real numbers"),
        (lambda: blocks.quantize(np.full((1, 256), 3e38, np.float32), "Q4_K"), "overflows"),
        (lambda: blocks.quantize(np.full((1, 32), 1e7, np.float32), "Q8_0"), "overflows"),
        (lambda: blocks.dequantize(np.zeros(143, np.uint8), "Q4_K"), "whole blocks"),
        (lambda: blocks.dequantize(np.zeros(144, np.int8), "Q4_K"), "uint8"),
        (lambda: blocks.quantize(np.ones((1, 256)), "IQ2_XXS"), "needs an importance matrix"),
        (lambda: blocks.quantize(np.ones((1, 256)), "iq2_xs"), "needs an importance matrix"),
        (lambda: blocks.quantize(np.ones((1, 256)), "IQ1_S"), "needs an importance matrix"),
        (lambda: blocks.quantize(np.linspace(-1e6, 1e6, 256)[None], "IQ1_M"), "overflows"),
        (lambda: blocks.quantize(np.linspace(-1e8, 1e8, 256)[None], "IQ3_S"), "overflows"),
        (lambda: blocks.quantize(np.ones((2, 576)), "IQ3_XXS"), "blocks of 256"),
        (lambda: blocks.quantize(np.ones((2, 576)), "IQ2_XXS", imatrix=np.ones(576)), "of 256"),
        (
            lambda: blocks.quantize(np.ones((1, 256)), "IQ2_S", imatrix=[np.nan] * 256),
            "importance vector for IQ2_S must be finite",
        ),
    ],
)
def test_bad_input_is_one_lowbit_error(call, match: str) -> None:
    """Bad input raises one LowbitError naming the problem."""
    with pytest.raises(LowbitError, match=match):
        call()


@pytest.mark.parametrize("path", ["numpy", "kernels"])
def test_fixtures_on_both_paths(path: str) -> None:
    """The numpy searches and the compiled ones (numba) both give llama.cpp's bytes."""
    from lowbit.codecs import _numba

    if path == "kernels":
        pytest.importorskip("numba")
    switch = _numba.numpy_only() if path == "numpy" else _numba.kernels_always()
    with switch:
        for out in OUTPUTS:
            x = _input(out["input"])
            im = _imatrix(out["input"]) if out["imatrix"] else None
            got = blocks.quantize(x, out["type"], imatrix=im)
            assert got.tobytes() == (FIXTURES / out["file"]).read_bytes(), out["file"]


@settings(max_examples=25, deadline=None)
@given(
    qtype=st.sampled_from(
        ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q5_1", "IQ4_NL", "IQ4_XS"]
    ),
    seed=st.integers(0, 2**32 - 1),
    tail=st.sampled_from([1.5, 4.0, 50.0]),
    zeros=st.booleans(),
    use_imatrix=st.booleans(),
    rows=st.sampled_from([1, 4, 9]),
)
def test_kernels_equal_numpy(
    qtype: str, seed: int, tail: float, zeros: bool, use_imatrix: bool, rows: int
) -> None:
    """The compiled searches give the numpy path's bytes on random and degenerate rows, for
    group counts below, at and past a multiple of the kernels' lanes (a row of 512 holds 16
    to 32 groups), and on scales whose inverses leave nearest_int's exact range."""
    pytest.importorskip("numba")
    from lowbit.codecs import _numba

    rng = np.random.default_rng(seed)
    x = rng.standard_t(tail, size=(rows, 512)).astype(np.float32)
    if zeros and rows >= 4:
        x[0] = 0
        x[1, :300] = 3.0
        x[2, ::3] = 0
        x[3, :256] *= np.float32(1e-37)  # near the float32 floor: 1/scale near overflow
        x[3, 256:320] = np.float32(1e-30) * np.arange(64)  # steps far below the group's max
    im = rng.uniform(0, 5, size=512).astype(np.float32) if use_imatrix else None
    with _numba.numpy_only():
        want = blocks.quantize(x, qtype, imatrix=im)
    with _numba.kernels_always():
        got = blocks.quantize(x, qtype, imatrix=im)
    assert got.tobytes() == want.tobytes()


def test_first_absmax_ignores_nan_as_c_does() -> None:
    """first_absmax keeps C's ``if (ax > amax)`` from 0: NaN never wins, an all-NaN column
    gives 0 and 0, ties go to the first value."""
    from lowbit.ggml._search import first_absmax

    x = np.array([[np.nan, np.nan, 0.0], [-3.0, np.nan, -2.0], [3.0, np.nan, 2.0]], np.float32)
    amax, vmax = first_absmax(x)
    assert amax.tolist() == [3.0, 0.0, 2.0]
    assert vmax.tolist() == [-3.0, 0.0, -2.0]


def test_overflowing_sums_agree_on_both_paths() -> None:
    """Values near 1e19 overflow Q3_K's weighted sums into NaN scales: the numpy search and the
    compiled one still give the same bytes (found by a sweep: they once differed)."""
    pytest.importorskip("numba")
    from lowbit.codecs import _numba

    rng = np.random.default_rng(559)
    rows = int(rng.integers(1, 7))
    x = rng.standard_t(3, size=(rows, 512)).astype(np.float32)
    x *= np.float32(10.0 ** rng.integers(-38, 30))  # 1e18: the largest |x| is 7.7e18
    im = rng.uniform(0, 5, 512).astype(np.float32)
    with _numba.numpy_only():
        want = blocks.quantize(x, "Q3_K", imatrix=im)
    with _numba.kernels_always():
        got = blocks.quantize(x, "Q3_K", imatrix=im)
    assert got.tobytes() == want.tobytes()
