"""lowbit.methods.gptq: GPTQ equals a plain transcription of the paper's Algorithm 1, lowers the
layer-output error against round-to-nearest, keeps lowbit's layouts, handles dead inputs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import lowbit
from layer_inputs import hessian, loud_inputs
from lowbit import LowbitError
from lowbit.formats.catalog import format as lookup
from lowbit.methods.gptq import GPTQ, ActOrder, gptq_quantize, layer_error
from lowbit.quant.scheme import Scheme

# ---- an obviously-right transcription of Algorithm 1 (Frantar et al. 2023) ----------------
#
# float64, one column at a time (no lazy batches), the inverse Hessian from np.linalg.inv, and
# quantizers written out from the scheme definitions in lowbit.quant.tensor's docstring (they
# share no code with lowbit's engine).

_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_NF4 = lookup("nf4").values().astype(np.float64)  # QLoRA's table, ascending = code order


def _fit(kind: str, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(scale, zero point) per row of a group ``w [out, g]``."""
    amax = np.max(np.abs(w), axis=1)
    zero = np.zeros(w.shape[0])
    if kind == "int4":
        s = amax / 7
    elif kind == "int4-asym":
        lo, hi = np.minimum(w.min(axis=1), 0), np.maximum(w.max(axis=1), 0)
        s = np.where(hi > lo, (hi - lo) / 15, 1.0).astype(np.float32).astype(np.float64)
        zero = np.clip(np.rint(-8 - lo / s), -8, 7)
        return s, zero
    elif kind == "fp4":
        s = amax / 6
    else:  # nf4
        s = amax
    s = np.where(amax > 0, s, 1.0)
    return s.astype(np.float32).astype(np.float64), zero


def _round(kind: str, w: np.ndarray, s: np.ndarray, z: np.ndarray) -> tuple[Any, Any]:
    """(codes as lowbit stores them, dequantized values) of one column."""
    t = w / s
    if kind in ("int4", "int4-asym"):
        c = np.clip(np.rint(t) + z, -8, 7)
        return c.astype(np.int64), (c - z) * s
    if kind == "fp4":
        i = np.argmin(np.abs(np.abs(t)[:, None] - _E2M1[None, :]), axis=1)
        neg = np.signbit(t)
        return i + 8 * neg, np.where(neg, -1.0, 1.0) * _E2M1[i] * s
    i = np.argmin(np.abs(t[:, None] - _NF4[None, :]), axis=1)
    return i, _NF4[i] * s


def algorithm1(
    W: np.ndarray, H: np.ndarray, kind: str, g: int, damp: float, static: bool
) -> np.ndarray:
    """The codes of GPTQ's Algorithm 1 with groups of ``g`` columns."""
    W = W.astype(np.float64).copy()
    out, n = W.shape
    H = H + damp * np.mean(np.diag(H)) * np.eye(n)
    order = np.argsort(-np.diag(H), kind="stable") if static else np.arange(n)
    U = np.linalg.cholesky(np.linalg.inv(H[order][:, order])).T  # upper, U^T U = H^-1
    params = {}
    if static:
        for k in range(0, n, g):
            params[k // g] = _fit(kind, W[:, k : k + g])
    Wp = W[:, order]
    codes = np.zeros((out, n), dtype=np.int64)
    for j in range(n):
        col = order[j]
        if not static and col % g == 0:  # the loop reaches a group: scales from its current values
            params[col // g] = _fit(kind, Wp[:, j : j + g])
        s, z = params[col // g]
        c, q = _round(kind, Wp[:, j], s, z)
        codes[:, col] = c
        err = (Wp[:, j] - q) / U[j, j]
        Wp[:, j:] -= np.outer(err, U[j, j:])
    return codes


def _correlated(rng: np.random.Generator, n: int, d: int, rank: int, noise: float) -> np.ndarray:
    """Inputs with a low-rank structure plus noise, and a few loud channels (as LLMs have)."""
    X = rng.normal(size=(n, rank)) @ rng.normal(size=(rank, d)) + noise * rng.normal(size=(n, d))
    X[:, rng.choice(d, 3, replace=False)] *= 4.0
    return X


SCHEMES = {
    "int4": Scheme(format="int4", group_size=16),
    "int4-asym": Scheme(format="int4", group_size=16, symmetric=False),
    "fp4": Scheme(format="fp4", group_size=16),
    "nf4": Scheme(format="nf4", group_size=16),
}


def _codes(qt: Any, kind: str) -> np.ndarray:
    c = qt.unpack().astype(np.int64)
    return c


# ---- gptq_quantize ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(SCHEMES))
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("block_size", [7, 24, 128])
def test_equals_algorithm1(kind: str, static: bool, block_size: int) -> None:
    """Same codes as the column-by-column transcription, for any lazy-batch size (blocks of
    7 and 24 cut groups of 16 in the middle, so pending updates must reach the group)."""
    rng = np.random.default_rng(1)
    W = rng.normal(size=(24, 64))
    H = hessian(_correlated(rng, 400, 64, 6, 0.3))
    qt = gptq_quantize(
        W, H, SCHEMES[kind], block_size=block_size, act_order="static" if static else "none"
    )
    expect = algorithm1(W, H, kind, 16, 0.01, static)
    np.testing.assert_array_equal(_codes(qt, kind), expect)


@pytest.mark.parametrize("kind", sorted(SCHEMES))
def test_lower_output_error_than_rtn(kind: str) -> None:
    """With correlated inputs, GPTQ's layer-output error is well below round-to-nearest's
    (measured on held-out inputs from the same distribution, not only the calibration set)."""
    rng = np.random.default_rng(2)
    d = 128
    mix = rng.normal(size=(8, d))
    loud = rng.choice(d, 3, replace=False)

    W = rng.normal(size=(48, d)) * 0.05
    X, Xtest = loud_inputs(rng, 2048, mix, loud), loud_inputs(rng, 2048, mix, loud)
    scheme = SCHEMES[kind]
    rtn = lowbit.quantize(W, scheme).dequantize(np.float64)
    for order in ("none", "static"):
        g = gptq_quantize(W, hessian(X), scheme, act_order=order).dequantize(np.float64)
        for data in (X, Xtest):
            H = hessian(data)
            ratio = layer_error(W, g, H) / layer_error(W, rtn, H)
            assert ratio < 0.25, (order, ratio)  # measured 0.05-0.07


@pytest.mark.parametrize(
    "spec",
    ["int4:g32", "int4:g32:asym", "nf4", "fp4:g32", "mxfp4", "fp8_e4m3:ch", "int8", "nf4:dq"],
)
def test_static_act_order_keeps_the_layout(spec: str) -> None:
    """Act-order with static groups stores the ordinary layout: same scheme, same scale and
    zero-point shapes, codes of the same size; it dequantizes with lowbit's usual code."""
    rng = np.random.default_rng(3)
    W = rng.normal(size=(16, 96)).astype(np.float32)
    H = hessian(_correlated(rng, 300, 96, 5, 0.2))
    plain = gptq_quantize(W, H, spec, act_order="none")
    static = gptq_quantize(W, H, spec, act_order="static")
    rtn = lowbit.quantize(W, plain.scheme)
    for qt in (plain, static):
        assert qt.scheme == rtn.scheme
        assert qt.shape == rtn.shape
        assert qt.scale.shape == rtn.scale.shape and qt.scale.dtype == rtn.scale.dtype
        assert (qt.zero_point is None) == (rtn.zero_point is None)
        if qt.zero_point is not None:
            assert qt.zero_point.shape == rtn.zero_point.shape
        assert qt.codes.shape == rtn.codes.shape and qt.nbytes == rtn.nbytes
        arrays, meta = qt.to_arrays()
        back = type(qt).from_arrays(arrays, meta)
        np.testing.assert_array_equal(back.dequantize(), qt.dequantize())
    assert not np.array_equal(static.codes, plain.codes)  # the order did change something


@pytest.mark.parametrize(
    "spec",
    ["int4:g16", "int4:g16:asym", "nf4", "fp4:g32", "mxfp4", "fp8_e4m3:ch", "int8", "int4:g40",
     "int4:t", "nf4:dq", "ternary", "nvfp4", "mxfp4:ct", "mxfp8_e4m3:carry"],
)  # fmt: skip
@pytest.mark.parametrize("order", ["none", "static"])
def test_uncorrelated_inputs_give_round_to_nearest(spec: str, order: str) -> None:
    """H = c·I (independent inputs of equal energy): no error is worth moving, so GPTQ gives
    exactly lowbit.quantize's codes and scales (int4:g40 has a ragged last group)."""
    rng = np.random.default_rng(4)
    W = rng.normal(size=(12, 100)).astype(np.float32)
    qt = gptq_quantize(W, 3.5 * np.eye(100), spec, act_order=order)
    rtn = lowbit.quantize(W, qt.scheme)
    np.testing.assert_array_equal(qt.unpack(), rtn.unpack())
    np.testing.assert_array_equal(qt.scale, rtn.scale)
    if rtn.zero_point is not None:
        np.testing.assert_array_equal(qt.zero_point, rtn.zero_point)
    np.testing.assert_array_equal(qt.dequantize(), rtn.dequantize())


@pytest.mark.parametrize("order", ["none", "static"])
def test_dead_input(order: str) -> None:
    """An input that is always 0 (H_jj = 0): its weights become code 0, and the other columns
    are quantized as if it did not exist."""
    rng = np.random.default_rng(5)
    W = rng.normal(size=(10, 48))
    X = _correlated(rng, 300, 48, 4, 0.3)
    X[:, 13] = 0.0
    H = hessian(X)
    scheme = Scheme(format="int4", axis=0)  # per output channel: the dead column's value
    W[:, 13] = 100.0  # would dominate every scale if it were not zeroed first
    qt = gptq_quantize(W, H, scheme, damp=0.0, act_order=order)
    keep = np.delete(np.arange(48), 13)
    reduced = gptq_quantize(W[:, keep], H[np.ix_(keep, keep)], scheme, damp=0.0, act_order=order)
    np.testing.assert_array_equal(qt.unpack()[:, 13], 0)
    np.testing.assert_array_equal(qt.unpack()[:, keep], reduced.unpack())
    np.testing.assert_array_equal(qt.scale, reduced.scale)


def test_all_inputs_dead() -> None:
    """H = 0 (no calibration signal at all): every weight is zeroed, nothing fails."""
    qt = gptq_quantize(np.ones((4, 8)), np.zeros((8, 8)), "int4:g4")
    np.testing.assert_array_equal(qt.dequantize(), 0.0)


def test_torch_and_float32_inputs_agree() -> None:
    """W and H may be float32 or torch tensors: the solve is float64 either way."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    W = rng.normal(size=(8, 32)).astype(np.float32)
    H = hessian(_correlated(rng, 100, 32, 3, 0.2)).astype(np.float32)
    a = gptq_quantize(W, H, "int4:g16")
    b = gptq_quantize(torch.from_numpy(W), torch.from_numpy(H), "int4:g16")
    np.testing.assert_array_equal(a.codes, b.codes)


def test_shared_hessian_equals_one_by_one() -> None:
    """quantize_shared (one factorisation for q/k/v) gives each weight's own result."""
    rng = np.random.default_rng(7)
    H = hessian(_correlated(rng, 200, 32, 4, 0.2))
    ws = {n: rng.normal(size=(r, 32)) for n, r in (("q", 8), ("k", 4), ("v", 4))}
    cfg = GPTQ(act_order="static")
    shared = cfg.quantize_shared(ws, H, dict.fromkeys(ws, "int4:g16"))
    for n, W in ws.items():
        np.testing.assert_array_equal(shared[n].codes, cfg.quantize(W, H, "int4:g16").codes)


def test_layer_error_is_the_output_error() -> None:
    """layer_error = 2/n ||X W^T - X Ŵ^T||² for H = 2 X^T X / n."""
    rng = np.random.default_rng(8)
    X, W, Wq = rng.normal(size=(50, 6)), rng.normal(size=(3, 6)), rng.normal(size=(3, 6))
    direct = 2 / 50 * np.sum((X @ W.T - X @ Wq.T) ** 2)
    assert layer_error(W, Wq, hessian(X)) == pytest.approx(direct, rel=1e-12)


# ---- settings and bad input ---------------------------------------------------------------


def test_config() -> None:
    """GPTQ is a frozen config with a str enum; bad settings are LowbitErrors."""
    cfg = GPTQ(damp=0.05, act_order="NONE")
    assert cfg.act_order is ActOrder.NONE
    assert cfg.to_dict() == {
        "method": "gptq",
        "damp": 0.05,
        "block_size": 128,
        "act_order": "none",
        "sequential": "layers",
    }
    assert GPTQ().act_order is ActOrder.STATIC
    for bad in ({"damp": -1}, {"damp": float("nan")}, {"block_size": 0}, {"act_order": "dyn"}):
        with pytest.raises(LowbitError):
            GPTQ(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("W", "H", "spec", "match"),
    [
        (np.ones((2, 3, 4)), np.eye(4), "int4", "2-D"),
        (np.ones((2, 4)), np.eye(3), "int4", r"\[in, in\]"),
        (np.full((2, 4), np.nan), np.eye(4), "int4", "finite"),
        (np.ones((2, 4)), np.eye(4), "fp8_block", "not 2-D tiles"),
        (np.ones((2, 4)), np.full((4, 4), np.inf), "int4", "NaN or inf"),
        (np.ones((2, 4)), -np.eye(4), "int4", "negative"),
        (np.ones((2, 4)), np.eye(4), Scheme(format="int4", axis=1), "axis=0"),
        (np.ones((2, 4)), np.eye(4), Scheme(format="int4", group_size=2, axis=0), "input axis"),
        (np.ones((2, 4)), np.eye(4), Scheme(format="int4", rounding="stochastic"), "stochastic"),
        (np.ones((2, 4)), np.eye(4), "bf16", "not a quantization scheme"),
    ],
)
def test_bad_input(W: Any, H: Any, spec: Any, match: str) -> None:
    """Shapes, values and layouts GPTQ cannot take are named in a LowbitError."""
    with pytest.raises(LowbitError, match=match):
        gptq_quantize(W, H, spec)


# ---- llama.cpp's Q4_0 / Q8_0 grids inside the loop ------------------------------------------


def _ggml_fit(bits: int, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(unrounded float32 d, stored float16 d) per row of a block ``w [out, 32]``, as ggml's
    quantize_row_q4_0_ref / q8_0_ref choose them."""
    w32 = w.astype(np.float32)
    if bits == 8:
        d = (np.abs(w32).max(axis=1) / np.float32(127)).astype(np.float32)
    else:
        m = w32[np.arange(len(w32)), np.abs(w32).argmax(axis=1)]  # first largest, sign kept
        d = (m / np.float32(-8)).astype(np.float32)
    return d, d.astype(np.float16).astype(np.float64)


def _ggml_round(bits: int, w: np.ndarray, d: np.ndarray, d16: np.ndarray) -> tuple[Any, Any]:
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    x = w.astype(np.float32) * inv
    if bits == 8:  # roundf: half away from zero
        q = np.clip(np.sign(x) * np.floor(np.abs(x) + np.float32(0.5)), -128, 127)
    else:
        q = np.clip(np.trunc(x + np.float32(8.5)), 0, 15) - 8
    return q.astype(np.int64), q * d16


def _ggml_algorithm1(W: np.ndarray, H: np.ndarray, bits: int, static: bool) -> np.ndarray:
    """Algorithm 1 with llama.cpp's block scales (fixed up front when static) and rounding."""
    W = W.astype(np.float64).copy()
    out, n = W.shape
    H = H + 0.01 * np.mean(np.diag(H)) * np.eye(n)
    order = np.argsort(-np.diag(H), kind="stable") if static else np.arange(n)
    U = np.linalg.cholesky(np.linalg.inv(H[order][:, order])).T
    params = {k // 32: _ggml_fit(bits, W[:, k : k + 32]) for k in range(0, n, 32)} if static else {}
    Wp = W[:, order]
    codes = np.zeros((out, n), dtype=np.int64)
    for j in range(n):
        col = order[j]
        if not static and col % 32 == 0:
            params[col // 32] = _ggml_fit(bits, Wp[:, j : j + 32])
        c, q = _ggml_round(bits, Wp[:, j], *params[col // 32])
        codes[:, col] = c
        Wp[:, j:] -= np.outer((Wp[:, j] - q) / U[j, j], U[j, j:])
    return codes


@pytest.mark.parametrize("spec", ["q4_0", "q8_0"])
@pytest.mark.parametrize("static", [False, True])
def test_ggml_grids_equal_algorithm1(spec: str, static: bool) -> None:
    """GPTQ to llama.cpp's Q4_0/Q8_0: the codes of the transcription with ggml's block scale
    and rounding rule, float16 scales, and a lower output error than llama.cpp's rounding."""
    rng = np.random.default_rng(11)
    W = rng.normal(size=(16, 128))
    H = hessian(_correlated(rng, 500, 128, 6, 0.3))
    qt = gptq_quantize(W, H, spec, act_order="static" if static else "none", block_size=48)
    assert qt.scheme.label == spec
    np.testing.assert_array_equal(qt.unpack(), _ggml_algorithm1(W, H, int(spec[1]), static))
    np.testing.assert_array_equal(qt.scale, qt.scale.astype(np.float16).astype(np.float32))
    rtn = lowbit.quantize(W.astype(np.float32), qt.scheme)  # llama.cpp's own rounding
    assert layer_error(W, qt.dequantize(), H) < 0.8 * layer_error(W, rtn.dequantize(), H)


@pytest.mark.parametrize("spec", ["q4_0", "q8_0"])
@pytest.mark.parametrize("order", ["none", "static"])
def test_ggml_grids_without_correlation_are_llama_cpp(spec: str, order: str) -> None:
    """H = c·I: exactly llama.cpp's codes and float16 scales (legacy.ggml_block_codes, which
    equals the gguf package's reference quantizer byte for byte)."""
    from lowbit.ggml.legacy import ggml_block_codes

    rng = np.random.default_rng(12)
    W = rng.normal(size=(12, 96)).astype(np.float32)
    qt = gptq_quantize(W, 2.0 * np.eye(96), spec, act_order=order)
    scale, codes = ggml_block_codes(W, int(spec[1]))
    np.testing.assert_array_equal(qt.unpack(), codes)
    np.testing.assert_array_equal(qt.scale, scale)


def test_ggml_grids_need_rows_of_32() -> None:
    with pytest.raises(LowbitError, match="multiple of 32"):
        gptq_quantize(np.ones((4, 40)), np.eye(40), "q4_0")
