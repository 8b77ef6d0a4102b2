"""lowbit.methods.awq, lowbit.methods.smoothquant, lowbit.methods.folds: scale searches that lower a
layer's output error for any scheme, and folds that leave a layer's outputs unchanged."""

from __future__ import annotations

import numpy as np
import pytest

import lowbit
from lowbit.methods.awq import AWQ, awq_clip, awq_search, output_error
from lowbit.methods.folds import FOLDS, FoldKind, fold_family, fold_scales, head_reduce, head_repeat
from lowbit.methods.smoothquant import SmoothQuant, smooth_scales, smoothquant_search
from lowbit.quant.scheme_text import parse_scheme


def _outlier_layer(seed: int = 0, n: int = 512, d_in: int = 64, d_out: int = 48) -> tuple:
    """Inputs with a few channels 30x larger than the rest (LLM activations' outliers)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d_in))
    X[:, [3, 17, 40]] *= 30.0
    W = rng.standard_normal((d_out, d_in)) * 0.05
    return X, W, 2.0 * X.T @ X / n


def _q(W: np.ndarray, scheme: str) -> lowbit.QuantizedTensor:
    return lowbit.quantize(W.astype(np.float32), parse_scheme(scheme))


def _rtn(W: np.ndarray, scheme: str) -> np.ndarray:
    return _q(W, scheme).dequantize(np.float64)


# ---- AWQ ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "scheme", ["int4:g32", "int4:g32:asym", "nf4", "mxfp4", "fp4:g16", "int3:ch", "q4_0"]
)
def test_awq_lowers_output_error_for_every_format(scheme: str) -> None:
    """On inputs with outlier channels AWQ's scales give a smaller layer-output error than round
    to nearest, for integer, NF4, MX, FP4 and GGUF grids; the reported errors are the real
    ones."""
    X, W, H = _outlier_layer()
    res = awq_search({"w": W}, H, np.abs(X).mean(0), {"w": scheme})
    base = output_error(W, np.zeros_like(W), H)
    rtn = output_error(W, _rtn(W, scheme), H) / base
    s = res.scales
    got = output_error(W, _deq_scaled(W, s, scheme), H) / base
    assert res.before == pytest.approx(rtn, rel=1e-5)  # the search's float32 products
    assert res.after == pytest.approx(got, rel=1e-5)
    assert res.after < 0.8 * res.before, (res.alpha, res.after, res.before)
    assert 0.0 < res.alpha < 1.0 and len(res.tried) == 20
    # the errors are a mean squared output error: check one against the layer's outputs
    Y = X @ W.T
    Yq = (X / s) @ _rtn(W * s, scheme).T
    assert np.mean(np.sum((Y - Yq) ** 2, axis=1)) * 2 / base == pytest.approx(got, rel=1e-9)


def _deq_scaled(W: np.ndarray, s: np.ndarray, scheme: str) -> np.ndarray:
    return _rtn(W * s, scheme) / s


def test_alpha_zero_is_round_to_nearest_code_for_code() -> None:
    """α = 0 gives s = 1: the codes and scales are round to nearest's, bit for bit."""
    X, W, H = _outlier_layer(1)
    res = awq_search({"w": W}, H, np.abs(X).mean(0), {"w": "int4:g32"}, AWQ(alpha=0.0))
    assert np.array_equal(res.scales, np.ones(64)) and res.alpha == 0.0
    a, b = _q(W * res.scales, "int4:g32"), _q(W, "int4:g32")
    assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scale, b.scale)
    assert np.array_equal(awq_clip(W, H, "int4:g32", AWQ(clip=False)), W)


def test_a_group_shares_one_scale_vector() -> None:
    """Layers reading one input get one α for their summed error; ``expand`` maps the searched
    scales onto the input columns (grouped-query heads)."""
    X, W, H = _outlier_layer(2)
    W2 = W[::-1].copy() * 3
    res = awq_search({"a": W, "b": W2}, H, np.abs(X).mean(0), {"a": "int4:g32", "b": "int4:g32"})
    base = sum(output_error(w, np.zeros_like(w), H) for w in (W, W2))
    err = sum(output_error(w, _deq_scaled(w, res.scales, "int4:g32"), H) for w in (W, W2))
    assert res.after == pytest.approx(err / base, rel=1e-5)
    half = awq_search(
        {"a": W}, H, np.abs(X).mean(0)[:32], {"a": "int4:g32"},
        expand=lambda s: np.concatenate([s, s]),
    )  # fmt: skip
    assert half.scales.shape == (32,)


@pytest.mark.parametrize("scheme", ["int4:g32", "int4:g32:asym", "int4:ch", "int4", "nf4"])
def test_clipping_never_raises_the_output_error(scheme: str) -> None:
    """The clipped weight's output error is at most the unclipped one's, and below it on
    heavy-tailed weights (a few huge weights stretch every group's scale)."""
    _, W, H = _outlier_layer(3)
    rng = np.random.default_rng(3)
    W = W + (rng.random(W.shape) < 0.01) * rng.standard_normal(W.shape) * 0.6
    Wc = awq_clip(W, H, scheme)
    assert output_error(W, _rtn(Wc, scheme), H) < output_error(W, _rtn(W, scheme), H)
    assert np.all(np.abs(Wc) <= np.abs(W) + 1e-15)


def test_settings() -> None:
    """Bad settings are LowbitErrors; to_dict names the method."""
    for bad in ({"grid": 0}, {"alpha": 1.5}, {"max_shrink": -0.1}, {"clip_grid": True}):
        with pytest.raises(lowbit.LowbitError):
            AWQ(**bad)  # type: ignore[arg-type]
    assert AWQ().to_dict()["method"] == "awq" and list(AWQ(grid=4).alphas()) == [0, 0.25, 0.5, 0.75]
    assert AWQ().ratios()[0] == 1.0 and AWQ().ratios()[-1] == pytest.approx(0.55)
    for bad in ({"alpha": -0.1}, {"grid": 1}, {"activations": "nf4"}, {"rows": 0}):
        with pytest.raises(lowbit.LowbitError):
            SmoothQuant(**bad)  # type: ignore[arg-type]
    assert SmoothQuant(activations="fp8").activations == "float8_e4m3fn"
    assert SmoothQuant(grid=4).alphas() == [None, 0.25, 0.5, 0.75]


# ---- SmoothQuant ----------------------------------------------------------------------


def test_smooth_scales_formula() -> None:
    """s_j = max|X_j|^α / max|W_j|^(1-α), maxima floored at 1e-5."""
    s = smooth_scales([4.0, 0.0, 9.0], [1.0, 2.0, 0.25], 0.5)
    np.testing.assert_allclose(s, [2.0, np.sqrt(1e-5) / np.sqrt(2.0), 6.0])
    np.testing.assert_allclose(smooth_scales([3.0], [5.0], 1.0), [3.0])
    np.testing.assert_allclose(smooth_scales([3.0], [5.0], 0.0), [0.2])


@pytest.mark.parametrize("act", ["int8", "fp8_e4m3"])
def test_smoothquant_lowers_w8a8_error_on_outliers(act: str) -> None:
    """With per-token activations, outlier channels ruin the other channels; SmoothQuant's
    scales lower the W8A8 output error a lot, and 'no smoothing' is RTN's error exactly."""
    X, W, _ = _outlier_layer(4)
    X[:, 3] *= 10  # int8 per token: the other channels keep ~2 bits
    res = smoothquant_search(
        {"w": W}, X, np.abs(X).max(0), {"w": "int8:ch"}, SmoothQuant(activations=act)
    )
    Y = X @ W.T
    Xq = lowbit.quantize_dynamic(X.astype(np.float32), act).dequantize(np.float64)
    rtn = np.sum((Y - Xq @ _rtn(W, "int8:ch").T) ** 2) / np.sum(Y**2)
    assert res.before == pytest.approx(rtn, rel=1e-5)
    assert res.after < 0.5 * res.before and 0 < res.alpha < 1
    # fixed α: exactly the formula's scales
    fixed = smoothquant_search(
        {"w": W}, X, np.abs(X).max(0), {"w": "int8:ch"}, SmoothQuant(alpha=0.5, activations=act)
    )
    np.testing.assert_allclose(fixed.scales, smooth_scales(np.abs(X).max(0), np.abs(W).max(0), 0.5))


@pytest.mark.parametrize("act", ["nvfp4", "mxfp4"])
def test_smoothquant_with_grouped_4bit_activations(act: str) -> None:
    """With --act's grouped modes the search measures the layer as lowbit eval runs it:
    'no smoothing' is exactly the error of the mode's fake quantization (NVFP4's global
    scale from the rows' maximum) and int4 weights; the chosen scales are the formula's."""
    torch = pytest.importorskip("torch")
    from lowbit.models.act_quant import fake_quantize_activation, fake_quantize_rows

    X, W, _ = _outlier_layer(5)
    cfg = SmoothQuant(activations=act, grid=10)
    with pytest.raises(lowbit.LowbitError, match="needs their simulation"):
        smoothquant_search({"w": W}, X, np.abs(X).max(0), {"w": "int4:g32"}, cfg)
    res = smoothquant_search(
        {"w": W}, X, np.abs(X).max(0), {"w": "int4:g32"}, cfg, simulate=fake_quantize_rows
    )
    Y = X @ W.T
    Xq = fake_quantize_activation(torch.from_numpy(X.astype(np.float32)), act).numpy()
    rtn = np.sum((Y - Xq.astype(np.float64) @ _rtn(W, "int4:g32").T) ** 2) / np.sum(Y**2)
    assert res.before == pytest.approx(rtn, rel=1e-4)
    assert res.before > 0 and res.after <= res.before and len(res.tried) == 10
    if res.alpha >= 0:
        want = smooth_scales(np.abs(X).max(0), np.abs(W).max(0), res.alpha)
        np.testing.assert_allclose(res.scales, want)
    # a width the mode's group does not divide is one LowbitError line
    with pytest.raises(lowbit.LowbitError, match="groups of"):
        smoothquant_search({"w": W[:, :40]}, X[:, :40], np.abs(X[:, :40]).max(0),
                           {"w": "int8:ch"}, cfg, simulate=fake_quantize_rows)  # fmt: skip


def test_smoothquant_activation_names() -> None:
    """Per-token formats keep their canonical names, grouped modes theirs; others refused."""
    assert SmoothQuant(activations="fp8_token").activations == "float8_e4m3fn"
    assert SmoothQuant(activations=" NVFP4 ").activations == "nvfp4"
    assert SmoothQuant(activations="fp8_block").to_dict()["activations"] == "fp8_block"
    for bad in ("mxfp6", "nf4", "bogus"):
        with pytest.raises(lowbit.LowbitError, match="grouped mode") as err:
            SmoothQuant(activations=bad)
        assert "\n" not in str(err.value)


# ---- folds ----------------------------------------------------------------------------


def test_fold_is_exact_for_a_norm_and_a_linear() -> None:
    """RMSNorm -> linear and linear -> linear give the same outputs after a fold (float64)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((7, 16))
    g, W1, b1, W2 = (
        rng.random(16) + 0.5,
        rng.standard_normal((16, 16)),
        rng.standard_normal(16),
        rng.standard_normal((5, 16)),
    )
    s = rng.random(16) + 0.3
    xn = x / np.sqrt(np.mean(x**2, axis=1, keepdims=True))
    (p, lin) = fold_scales({"weight": g}, {"w": W2}, s, s)
    np.testing.assert_allclose((xn * p["weight"]) @ lin["w"].T, (xn * g) @ W2.T, rtol=1e-12)
    (p, lin) = fold_scales({"weight": W1, "bias": b1}, {"w": W2}, s, s)
    np.testing.assert_allclose(
        (x @ p["weight"].T + p["bias"]) @ lin["w"].T, (x @ W1.T + b1) @ W2.T, rtol=1e-12
    )
    with pytest.raises(lowbit.LowbitError, match="positive"):
        fold_scales({"weight": g}, {"w": W2}, -s, s)
    with pytest.raises(lowbit.LowbitError, match="does not match"):
        fold_scales({"weight": g[:3]}, {"w": W2}, s, s)


def test_head_repeat_follows_grouped_query_attention() -> None:
    """Query head h reads value head h // (heads / kv_heads): channel h*d + j gets value
    channel (h // rep)*d + j's scale; the reduction is its inverse for repeated values."""
    s = np.arange(1.0, 7.0)  # 2 kv heads of 3 channels
    np.testing.assert_array_equal(head_repeat(s, 12, 3), [1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6])
    np.testing.assert_array_equal(head_reduce(head_repeat(s, 12, 3), 6, 3, "max"), s)
    v = np.array([1, 2, 3, 3, 4, 5, 0, 0, 0, 2, 2, 2.0])
    np.testing.assert_array_equal(head_reduce(v, 6, 3, "mean"), [2, 3, 4, 1, 1, 1])
    with pytest.raises(lowbit.LowbitError, match="whole heads"):
        head_repeat(s, 10, 3)


def test_the_table() -> None:
    """Every family's folds are data: llama's four (v -> o through the heads), BERT's one; the
    families are found by config model_type."""
    assert [f.prev for f in FOLDS["llama"]] == [
        "input_layernorm", "self_attn.v_proj", "post_attention_layernorm", "mlp.up_proj"
    ]  # fmt: skip
    assert [f.kind for f in FOLDS["llama"]] == [
        FoldKind.NORM,
        FoldKind.HEADS,
        FoldKind.NORM,
        FoldKind.LINEAR,
    ]
    assert FOLDS["bert"][0].linears == ("attention.output.dense",)
    assert fold_family("Qwen2") == "llama" and fold_family("bert") == "bert"
    assert fold_family("gemma") is None and fold_family(None) is None
