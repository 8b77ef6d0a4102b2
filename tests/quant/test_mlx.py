"""lowbit.quant.mlx: MLX's packed rows, byte for byte as ``mx.quantize`` makes them on the CPU."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from lowbit.errors import LowbitError
from lowbit.quant import mlx as Q

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = (np.dtype(np.float32), np.dtype(np.float16), BF16)
AFFINE = [(g, b) for g in Q.AFFINE_GROUP_SIZES for b in Q.AFFINE_BITS]
FP_MODES = ("mxfp4", "mxfp8", "nvfp4")


# --- golden bytes (no mlx needed) --------------------------------------------------------------
# Taken once from mx.quantize (mlx 0.32.4, CPU) on the rows below and written here.
ROW = np.array([((i * 37) % 64 - 31) / 32 for i in range(64)], dtype=np.float32)[None, :]
ROW[0, 5] = 1.5  # the edge: |max| > |min|, so the scale comes out negative


# mode, group, bits, dtype -> [words, scales, biases] as hex of their little-endian bytes
GOLDEN_BYTES = {
    ("affine", 32, 3, "float32"): [
        ("a757d0b32a7a1543afa26755fc9c6297c3ef6af839052fa7"),
        ("0000c0be000078be"),
        ("0000c03f0000783f"),
    ],
    ("affine", 64, 4, "bfloat16"): [
        ("8f6d0be9c7a5947e5c3ad8b6948e6d4be9c7a5836d4bfad8b6947e5c3ae8c7a5"),
        ("2bbe"),
        ("c03f"),
    ],
    ("affine", 32, 5, "float16"): [
        ("3fee76c1f44f2f8b647759551379c3897ab8d945af2b5c26703c5d223fd3a70ae8573634389e2e91"),
        ("0dadc0ab"),
        ("003ec03b"),
    ],
    ("affine", 64, 8, "float32"): [
        (
            "ff88df67bf009ef57ed55eb53d95ec74cb54ab348be26bc24aa1f981d861b84198ef77cf57ae378e"
            "e56ec54ea5fc84dc64bb449bf27bd25ab23a91e871c851a8"
        ),
        ("0a8e1ebc"),
        ("0000c03f"),
    ],
    ("mxfp4", 32, 4, "float32"): [
        ("1e4d7bd0c2a4063d5c69d1b4052e4c5ad0c395163d5be9c2a4052d4c6ad1b395"),
        ("7d7d"),
        None,
    ],
    ("mxfp8", 32, 8, "bfloat16"): [
        (
            "f864f270eb7cd0f669f172e87658f46cef73e27862f36fec74d8f668f271e97650f56bf072e47860"
            "f46eed74dcf766f270ea7600f66af072e6775cf46dee74e0"
        ),
        ("7777"),
        None,
    ],
    ("nvfp4", 16, 4, "float32"): [
        ("1e4d7bd0c2a4063d6d7ae2c5963f5d7bf0d4a6275e6df9e3c5074f6d7be1d5a6"),
        ("28232222"),
        None,
    ],
}


def _hex(q: tuple) -> list:
    return [None if a is None else a.tobytes().hex() for a in q]


def test_pack_rows_bit_order() -> None:
    """Codes 1..8 at 4 bits make the word 0x87654321; 3-bit codes straddle words LSB first."""
    w = Q.pack_rows(np.arange(1, 9, dtype=np.uint8)[None, :], 4)
    assert w.dtype == np.uint32 and w.tolist() == [[0x87654321]]
    codes = np.zeros((1, 32), dtype=np.uint8)
    codes[0, 10] = 0b111  # stream bits 30, 31 and 32: two in word 0, one in word 1
    assert Q.pack_rows(codes, 3).tolist() == [[0xC0000000, 0x00000001, 0]]


@pytest.mark.parametrize("bits", Q.AFFINE_BITS)
def test_pack_unpack_identity(bits: int) -> None:
    """unpack_rows(pack_rows(c)) == c for every width MLX holds."""
    c = np.random.default_rng(bits).integers(0, 2**bits, size=(3, 128), dtype=np.uint8)
    assert np.array_equal(Q.unpack_rows(Q.pack_rows(c, bits), bits), c)


@pytest.mark.parametrize("key", list(GOLDEN_BYTES), ids=str)
def test_golden_bytes(key: tuple) -> None:
    """A fixed row's words, scales and biases equal what mx.quantize wrote (mlx 0.32.4, CPU)."""
    mode, gs, bits, dt = key
    w = ROW.astype(BF16 if dt == "bfloat16" else np.dtype(dt))
    assert _hex(Q.quantize(w, mode=mode, group_size=gs, bits=bits)) == GOLDEN_BYTES[key]


def test_affine_negative_scale_and_exact_edge() -> None:
    """The edge value (larger magnitude end) dequantizes exactly; the scale then is negative."""
    words, scales, biases = Q.quantize(ROW, group_size=64, bits=4)
    assert scales[0, 0] < 0 and biases[0, 0] == np.float32(1.5)
    back = Q.dequantize(words, scales, biases, group_size=64, bits=4)
    assert back[0, 5] == np.float32(1.5)


def test_affine_error_bound() -> None:
    """|w - dequant(quant(w))| <= |scale| / 2 (plus float32 rounding) wherever the group's
    grid reaches; the grid is anchored at the edge, so the far end may be clipped (MLX's rule)."""
    w = np.random.default_rng(3).standard_normal((8, 256)).astype(np.float32)
    for gs, bits in AFFINE:
        q = Q.quantize(w, group_size=gs, bits=bits)
        back = Q.dequantize(*q, group_size=gs, bits=bits)
        s = np.repeat(q[1], gs, axis=-1)
        b = np.repeat(q[2], gs, axis=-1)
        top = b + s * (2**bits - 1)
        inside = (w >= np.minimum(b, top)) & (w <= np.maximum(b, top))
        assert inside.mean() > 0.8
        err = np.abs(back - w)[inside]
        assert np.all(err <= np.abs(s)[inside] * 0.5001 + 1e-6), (gs, bits)


def test_mx_exponent_is_ceil() -> None:
    """MLX's E8M0 exponent is ceil(log2(amax / max)): 6.0 -> 0, 6.01 -> 1, 5.99 -> 0, 0 -> 0."""
    s = np.array([1.0, 6.01 / 6, 5.99 / 6, 0.0, 2.0**-10], dtype=np.float32)
    assert Q.mlx_e8m0_exponent(s).tolist() == [0, 1, 0, 0, -10]


def test_e2m1_ties_toward_zero() -> None:
    """E2M1 codes: the first table entry wins ties (0.25 -> 0, 0.75 -> 0.5, -2.5 -> -2)."""
    vals = [6.0, 0.25, -0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.1, -2.5, 5.5]
    w = np.zeros((1, 32), dtype=np.float32)
    w[0, : len(vals)] = vals
    words, scales, _ = Q.quantize(w, mode="mxfp4")
    codes = Q.unpack_rows(words, 4)[0, : len(vals)]
    # from mx.quantize (mlx 0.32.4, CPU): the same codes
    assert scales.tolist() == [[127]]
    assert codes.tolist() == [7, 0, 0, 1, 2, 3, 4, 5, 6, 0, 12, 7]


@pytest.mark.parametrize(
    ("mode", "gs", "bits", "msg"),
    [
        ("affine", 64, 7, "bits"),
        ("affine", 16, 4, "groups"),
        ("mxfp4", 64, 4, "mxfp4"),
        ("int4", 64, 4, "unknown MLX quantization mode"),
    ],
)
def test_bad_params(mode: str, gs: int, bits: int, msg: str) -> None:
    """Bits, group sizes and modes MLX cannot hold: one LowbitError line."""
    with pytest.raises(LowbitError, match=msg):
        Q.quantize(np.zeros((2, 128), np.float32), mode=mode, group_size=gs, bits=bits)


def test_bad_inputs() -> None:
    """Rows that are not whole groups, vectors, ints and NaN: LowbitError."""
    for w, msg in [
        (np.zeros((2, 96), np.float32), "groups of 64"),
        (np.zeros(128, np.float32), "matrices"),
        (np.zeros((2, 128), np.int32), "float32, float16 or bfloat16"),
        (np.full((2, 128), np.nan, np.float32), "NaN"),
    ]:
        with pytest.raises(LowbitError, match=msg):
            Q.quantize(w)


def test_dequantize_shape_checks() -> None:
    """Scales of the wrong size, words not uint32, biases missing: LowbitError."""
    words, scales, biases = Q.quantize(np.ones((2, 128), np.float32))
    with pytest.raises(LowbitError, match="do not fit"):
        Q.dequantize(words, scales[:, :1], biases[:, :1])
    with pytest.raises(LowbitError, match="uint32"):
        Q.dequantize(words.astype(np.int64), scales, biases)
    with pytest.raises(LowbitError, match="biases"):
        Q.dequantize(words, scales, None)
    with pytest.raises(LowbitError, match="do not fit"):
        Q.dequantize(words, scales, biases, bits=8)


# --- against mx.quantize / mx.dequantize -------------------------------------------------------


def _mx():
    return pytest.importorskip(
        "mlx.core", reason="mlx[cpu] is not installed (pip install 'mlx[cpu]')"
    )


def _to_mx(mx, a: np.ndarray):
    if a.dtype == BF16:
        return mx.array(a.view(np.uint16)).view(mx.bfloat16)
    return mx.array(a)


def _to_np(mx, a) -> np.ndarray:
    if a.dtype == mx.bfloat16:
        return np.array(a.view(mx.uint16)).view(BF16)
    return np.array(a)


def _weights(kind: str, seed: int, shape: tuple[int, int] = (16, 256)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "normal":
        return rng.standard_normal(shape) * 0.05
    if kind == "heavy":  # Student t with 2 degrees of freedom: outliers of 100 sigma
        return rng.standard_t(2, shape) * 0.02
    if kind == "scales":  # rows spanning 2**-20 .. 2**10
        return rng.standard_normal(shape) * np.exp2(rng.uniform(-20, 10, (shape[0], 1)))
    if kind == "const":
        w = np.zeros(shape)
        w[0::3] = 0.3
        w[1::3] = -0.2
        return w
    if kind == "zeros":  # rows with many exact zeros and only negatives
        w = rng.standard_normal(shape)
        w[w > 0] = 0
        w[:, ::3] = 0
        return w
    if kind == "ties":  # small integers: many values fall on rounding midpoints
        return rng.integers(-8, 9, shape) / 4
    raise AssertionError(kind)


KINDS = ("normal", "heavy", "scales", "const", "zeros", "ties")


def _check(mx, w: np.ndarray, mode: str, gs: int, bits: int) -> None:
    want = mx.quantize(_to_mx(mx, w), group_size=gs, bits=bits, mode=mode)
    got = Q.quantize(w, mode=mode, group_size=gs, bits=bits)
    for i, (a, b) in enumerate(zip(want, got, strict=False)):  # MLX gives no biases in FP modes
        if b is None:
            continue
        a = _to_np(mx, a)
        assert a.dtype == b.dtype and a.shape == b.shape, (mode, gs, bits, i)
        assert a.tobytes() == b.tobytes(), (mode, gs, bits, w.dtype, i)
    if mode == "affine":
        d = mx.dequantize(*want, group_size=gs, bits=bits, mode=mode)
    else:
        d = mx.dequantize(want[0], want[1], group_size=gs, bits=bits, mode=mode)
    d = _to_np(mx, d)
    mine = Q.dequantize(*got, mode=mode, group_size=gs, bits=bits)
    assert d.dtype == mine.dtype and d.tobytes() == mine.tobytes(), ("dequantize", mode, gs, bits)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("kind", KINDS)
def test_affine_equals_mlx(dtype: np.dtype, kind: str) -> None:
    """Every affine bits x group size: words, scales, biases and dequantized bytes equal MLX's."""
    mx = _mx()
    w = _weights(kind, 7).astype(dtype)
    for gs, bits in AFFINE:
        _check(mx, w, "affine", gs, bits)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", FP_MODES)
def test_fp_modes_equal_mlx(dtype: np.dtype, kind: str, mode: str) -> None:
    """mxfp4, mxfp8, nvfp4: words, uint8 scales and dequantized bytes equal MLX's."""
    mx = _mx()
    gs, bits = Q.mode_defaults(mode)
    w = _weights(kind, 11).astype(dtype)
    if dtype == np.float16 and kind == "scales":
        w = np.clip(w, -6e4, 6e4).astype(dtype)
    _check(mx, w, mode, gs, bits)


@pytest.mark.parametrize("seed", range(8))
def test_random_widths_equal_mlx(seed: int) -> None:
    """Random shapes, dtypes, modes and magnitudes (seeded): equal to MLX's bytes."""
    mx = _mx()
    rng = np.random.default_rng(100 + seed)
    for _ in range(12):
        mode = str(rng.choice(["affine", *FP_MODES]))
        gs, bits = Q.mode_defaults(mode)
        if mode == "affine":
            gs, bits = AFFINE[rng.integers(len(AFFINE))]
        rows = int(rng.integers(1, 9))
        cols = gs * int(rng.integers(1, 5))
        if mode == "nvfp4":
            cols = 32 * int(rng.integers(1, 5))  # MLX 0.32's CPU path needs rows of 32s
        dtype = DTYPES[rng.integers(3)]
        w = rng.standard_normal((rows, cols)) * 10.0 ** rng.uniform(-4, 2)
        _check(mx, w.astype(dtype), mode, gs, bits)


@pytest.mark.parametrize("model", ["smollm2", "minilm"])
def test_real_weights_equal_mlx(model: str) -> None:
    """Real weights (SmolLM2's q_proj and down_proj as its GGUF decodes them, MiniLM's
    outlier-heavy feed-forward output layer), in the three dtypes, every affine bits x group
    and the FP modes: MLX's bytes."""
    mx = _mx()
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from lowbit.checkpoints import open_checkpoint
    from tiny_models import shipped_path

    ck = open_checkpoint(shipped_path(model))
    names = (
        ["blk.3.attn_q.weight", "blk.7.ffn_down.weight"]
        if model == "smollm2"
        else ["encoder.layer.2.output.dense.weight"]
    )
    for name in names:
        w32 = np.asarray(ck.get(name), dtype=np.float32)[:64]
        for dt in DTYPES:
            w = w32.astype(dt)
            for gs, bits in AFFINE:
                if w.shape[1] % gs == 0:  # SmolLM2's rows of 576 are not groups of 128
                    _check(mx, w, "affine", gs, bits)
            for mode in FP_MODES:
                gs, bits = Q.mode_defaults(mode)
                _check(mx, w, mode, gs, bits)
    ck.close()
